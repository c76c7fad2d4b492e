"""Writing a job's events: the per-step events script and the event payloads."""

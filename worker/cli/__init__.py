"""The `conveyor` command: options, preflight checks, the demo, logs, the tiny test model."""

"""The generic path: any decoder-only causal LM in transformers, its own modules on Conveyor's paged attention."""

"""Pieces of the sampler, one idea per file; `engine.sampler` is the import point."""

"""Structured outputs: constrained decoding with xgrammar (JSON schema, regex, choice, EBNF).

spec.py (what a request asks, torch-free) -> compiler.py + compile_process.py (off the step loop, cached,
with a timeout) -> manager.py (per-request matchers) -> batch_mask.py (one bitmask per step).
"""

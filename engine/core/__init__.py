"""The engine's torch-free core: scheduler, KV block bookkeeping, request state, finish rules.

Everything here builds from plain ints and lists, so it is unit-tested on the CPU in milliseconds;
tests/engine_core/test_core_imports_no_torch.py fails if any of it starts importing torch.
"""

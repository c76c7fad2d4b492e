"""Helpers shared by the tests, imported one way: `from tests.helpers.<module> import ...`.

hf_reference       transformers' own model as the reference for parity tests
model_helpers      attention metadata and requests built by hand for model and backend tests
engine_core_utils  make_scheduler / make_requests and a hand-built runner output for scheduler tests
paged_batch        random paged KV batches for kernel tests
rel_helpers        redis-server processes, worker subprocesses and waiting helpers for reliability tests
worker_fakes       FakeEngine (an EngineClient) and a Worker on a thread for the worker's Redis tests
"""

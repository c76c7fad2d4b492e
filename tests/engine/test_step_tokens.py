"""`step_tokens()`: the tokens each request's KV gained in the last step (what accounting splits a step's
wall time by): prefill chunks by their length, decode steps one per sample, samples under their request."""

from __future__ import annotations

from engine import LLMEngine, SamplingParams


def test_prefill_chunks_and_decode_tokens_are_counted_per_request(tiny_model_dir):
    llm = LLMEngine(
        str(tiny_model_dir("llama")),
        num_kv_blocks=64,
        dtype="float32",
        device="cpu",
        max_num_batched_tokens=16,  # a 40-token prompt prefills in chunks of at most 16
    )
    params = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
    long = llm.add_request("long", list(range(5, 45)), params)
    short = llm.add_request("short", [5, 6, 7], params.model_copy(update={"n": 2, "temperature": 1.0}))
    assert llm.step_tokens() == {}  # nothing stepped yet
    seen: list[dict[str, int]] = []
    while llm.has_unfinished_requests():
        llm.step()
        seen.append(llm.step_tokens())
    assert all(sum(step.values()) <= 16 for step in seen)
    assert {rid for step in seen for rid in step} == {"long", "short"}
    # Every prompt token once, then each output token but the last (sampled, never fed back).
    assert sum(step.get("long", 0) for step in seen) == long + 5 - 1
    assert max(step.get("long", 0) for step in seen) == 16
    # Two samples share the prompt's KV (the second forks it) and decode one token each per step.
    assert sum(step.get("short", 0) for step in seen) == short + 2 * (5 - 1)

"""SamplingParams(max_tokens=None): generate until the context (max_model_len) is full, or up to a cap."""

from __future__ import annotations

from engine import LLMEngine, SamplingParams

MAX_MODEL_LEN = 24


def _run(engine: LLMEngine, request_id: str, cap: int | None = None) -> tuple[int, list[int], str | None]:
    params = SamplingParams(max_tokens=None, temperature=0, ignore_eos=True)
    prompt_tokens = engine.add_request(request_id, [5, 6, 7, 8, 9], params, max_tokens_cap=cap)
    ids: list[int] = []
    reason = None
    while engine.has_unfinished_requests():
        for delta in engine.step():
            ids += delta.new_token_ids
            reason = delta.finish_reason or reason
    return prompt_tokens, ids, reason


def test_none_runs_until_the_context_is_full_and_a_cap_bounds_it(tiny_model_dir):
    assert SamplingParams().max_tokens == 16  # the Python API's default is unchanged
    engine = LLMEngine(
        str(tiny_model_dir("llama")), num_kv_blocks=32, max_model_len=MAX_MODEL_LEN, device="cpu"
    )
    prompt_tokens, ids, reason = _run(engine, "full")
    assert len(ids) == MAX_MODEL_LEN - prompt_tokens and reason == "length"
    _, ids, reason = _run(engine, "capped", cap=3)
    assert len(ids) == 3 and reason == "length"

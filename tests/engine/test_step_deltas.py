"""Every StepDelta of a running sample carries its counts, not only the finishing one (step() builds the
common delta inline)."""

from __future__ import annotations

from engine import LLMEngine, SamplingParams


def test_running_deltas_carry_prompt_and_output_counts(tiny_model_dir):
    llm = LLMEngine(str(tiny_model_dir("llama")), num_kv_blocks=64, dtype="float32", device="cpu")
    n = llm.add_request("a", [5, 6, 7, 8], SamplingParams(max_tokens=5, temperature=0, ignore_eos=True))
    deltas = []
    while llm.has_unfinished_requests():
        deltas += llm.step()
    assert [(d.num_prompt_tokens, d.first_index, d.num_output_tokens) for d in deltas] == [
        (n, i, i + 1) for i in range(5)
    ]
    assert [d.finished for d in deltas] == [False] * 4 + [True]
    assert all(d.request_id == "a" and d.sample_index == 0 and len(d.new_token_ids) == 1 for d in deltas)

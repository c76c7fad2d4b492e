"""engine.stats(): prompt tokens received against computed, and the prefix cache's hit rate in tokens."""

from __future__ import annotations

from engine import LLMEngine, SamplingParams
from tests.helpers.engine_drain import drain


def test_prompt_tokens_received_computed_and_the_hit_rate(tiny_model_dir):
    llm = LLMEngine(
        str(tiny_model_dir("llama")), num_kv_blocks=64, block_size=16, dtype="float32", device="cpu"
    )
    assert (llm.stats().num_prompt_tokens, llm.stats().prefix_cache_hit_rate) == (0, 0.0)
    params = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
    shared = list(range(10, 42))  # two full blocks of 16
    llm.add_request("a", shared + [50] * 8, params)
    drain(llm)
    llm.add_request("b", shared + [60] * 8, params)  # hits a's two full blocks
    llm.add_request("c", [70] * 5, params.model_copy(update={"n": 2, "temperature": 1.0, "seed": 1}))
    drain(llm)
    s = llm.stats()
    assert s.num_prompt_tokens == 40 + 40 + 5  # c's prompt once, whatever its n
    assert s.prefix_cache_hits >= 32
    assert s.num_prompt_tokens_computed == s.prefix_cache_queries - s.prefix_cache_hits
    assert s.num_prompt_tokens_computed <= s.num_prompt_tokens + 5 - 32
    assert s.prefix_cache_hit_rate == s.prefix_cache_hits / s.prefix_cache_queries

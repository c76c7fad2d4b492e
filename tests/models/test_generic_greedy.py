"""The generic path (transformers' own modules on Conveyor's paged attention), greedy, token for token against
transformers' `generate`, on tiny random checkpoints of families the native code does not cover.

Each family shows something the native Llama code does not have: soft-capping and alternating windows (Gemma 2),
five-to-one windows and per-layer-type rotary (Gemma 3), partial rotary and fused projections (Phi-3), norms after
the blocks (OLMo 2), mixtures of experts (Mixtral, Qwen3-MoE), parallel residual and LayerNorm (GPT-NeoX). Windows
are 8 tokens, so every prompt but the shortest is longer than them.
"""

from __future__ import annotations

import pytest
import torch

from engine import LLMEngine, SamplingParams
from tests.helpers.hf_reference import greedy_agrees, hf_greedy, hf_model

WINDOW = 8
TINY = {"hidden_size": 32, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "vocab_size": 320}
FAMILIES = {
    "gemma2": {"config_overrides": {"sliding_window": WINDOW}},  # layers: sliding, full; soft-capped
    "gemma3": {
        "num_layers": 3,
        "config_overrides": {
            "sliding_window": WINDOW,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
        },
    },
    "phi3": {"config_overrides": {"partial_rotary_factor": 0.5}},
    "olmo2": {},
    "mixtral": {"config_overrides": {"sliding_window": WINDOW}},  # every layer windowed
    "qwen3_moe": {},
    "gpt_neox": {},
}
# Token counts; prompt 3 shares its first 20 tokens (a full block of 16) with prompt 2.
PROMPT_LENGTHS = [3, 17, 40, 9, 33]
MAX_TOKENS = 16
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tiny_model_dir):
    model_dir = tiny_model_dir(request.param, **{**TINY, **FAMILIES[request.param]})
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, TINY["vocab_size"], (n,), generator=g).tolist() for n in PROMPT_LENGTHS]
    prompts[3] = prompts[2][:20] + prompts[3]
    reference = hf_model(model_dir)
    expected = [hf_greedy(reference, p, MAX_TOKENS) for p in prompts]
    return str(model_dir), prompts, expected, reference


def _engine(model_dir: str, **options) -> LLMEngine:
    options = {"block_size": 16, "dtype": "float32", "device": "cpu", "num_kv_blocks": 128, **options}
    return LLMEngine(model_dir, **options)


def _check(family, got: list[list[int]]) -> None:
    _, prompts, expected, reference = family
    for prompt, g, e in zip(prompts, got, expected, strict=True):
        assert greedy_agrees(reference, prompt, g, e), (prompt, g, e)


def test_auto_picks_the_generic_path(family):
    engine = _engine(family[0])
    assert type(engine.model).__name__ == "TransformersCausalLM"


def test_mixed_length_batch(family):
    outs = _engine(family[0]).generate(family[1], GREEDY)
    _check(family, [o.token_ids for o in outs])


def test_tiny_token_budget_and_pool_preempt(family):
    # Prefill in chunks of 8 tokens; 12 blocks of 8 hold about half of what the five requests need at once.
    engine = _engine(family[0], block_size=8, num_kv_blocks=12, max_num_batched_tokens=8)
    outs = engine.generate(family[1], GREEDY)
    assert engine.stats().num_preemptions > 0
    _check(family, [o.token_ids for o in outs])


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_prefix_caching_on_and_off(family, prefix_caching):
    engine = _engine(family[0], enable_prefix_caching=prefix_caching)
    first = [o.token_ids for o in engine.generate(family[1], GREEDY)]
    second = [o.token_ids for o in engine.generate(family[1], GREEDY)]  # every full prompt block is cached
    assert (engine.stats().prefix_cache_hits > 0) == prefix_caching
    _check(family, first)
    _check(family, second)

"""Gemma 3 270M (Q4_K_M, the built-in `gemma3-270m`: Q4_K, Q5_0, Q6_K and Q8_0 tensors, on the generic path)
dequantized to float32: greedy tokens identical to transformers' own GGUF load for plain prompts. The file has
no chat template (a pretrained model), so there is no chat prompt here. 238 MB fetched on first use into the
cache folder (CONVEYOR_CACHE where set)."""

from __future__ import annotations

import pytest

from engine import LLMEngine, SamplingParams
from tests.helpers.hf_reference import hf_greedy, hf_model
from worker.cli.builtin_models import fetch

pytestmark = pytest.mark.slow  # a 262k vocabulary: building its tokenizer and both loads take minutes

MAX_TOKENS = 12


def test_greedy_tokens_equal_transformers_gguf_load():
    path = fetch("gemma3-270m")
    engine = LLMEngine(str(path), dtype="float32", device="cpu", num_kv_blocks=64)
    prompts = [engine.tokenizer.encode(text) for text in ("The capital of France is", "Once upon a time")]
    got = engine.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True))
    reference = hf_model(path.parent, gguf_file=path.name)
    expected = [hf_greedy(reference, prompt, MAX_TOKENS) for prompt in prompts]
    assert [o.token_ids for o in got] == expected

"""The whole engine on a tiny GGUF file of each family, greedy, token for token against transformers'
`generate` on the source checkpoint: the names, the Q/K row order, Gemma's norms and the config all mapped
(Llama, Qwen2, Qwen3 on the native models; Gemma 2 and 3 on the generic path). A Q8_0 file loads and
starts out as its source does."""

from __future__ import annotations

import pytest
import torch

from engine import LLMEngine, SamplingParams
from tests.gguf_files.conftest import FAMILIES
from tests.helpers.hf_reference import hf_greedy, hf_model

MAX_TOKENS = 12
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)


def _prompts(vocab_size: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, vocab_size, (n,), generator=g).tolist() for n in (5, 21)]


def _engine(path) -> LLMEngine:
    return LLMEngine(str(path), block_size=16, dtype="float32", device="cpu", num_kv_blocks=64)


@pytest.mark.parametrize("arch", list(FAMILIES))
def test_greedy_tokens_equal_transformers_on_the_source(tiny_gguf, arch):
    folder, path = tiny_gguf(arch)
    reference = hf_model(folder)
    prompts = _prompts(reference.config.vocab_size)
    expected = [hf_greedy(reference, p, MAX_TOKENS) for p in prompts]
    got = [o.token_ids for o in _engine(path).generate(prompts, GREEDY)]
    assert got == expected


def test_a_q8_0_file_generates_mostly_like_its_source(tiny_gguf):
    folder, path = tiny_gguf("llama", "Q8_0")
    reference = hf_model(folder)
    prompts = _prompts(reference.config.vocab_size)
    expected = [hf_greedy(reference, p, MAX_TOKENS) for p in prompts]
    got = [o.token_ids for o in _engine(path).generate(prompts, GREEDY)]
    # 8-bit weights move the logits a little: the first tokens agree (the tiny model's top two are far apart).
    assert all(g[:4] == e[:4] for g, e in zip(got, expected, strict=True))

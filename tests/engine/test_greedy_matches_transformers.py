"""The whole engine, greedy, token for token against transformers' own `generate` on the same weights.

The windowed cases have windows shorter than most prompts plus their 24 new tokens (prompts of 33 and 40
tokens, windows 24 and 16, on and off the 16-token block boundary); Qwen2's window is on its second layer
only (`max_window_layers` 1), so the backend gets a different window per layer in one step.
"""

from __future__ import annotations

import json

import pytest
import torch

from engine import LLMEngine, SamplingParams
from engine.models.registry import FAMILIES
from tests.helpers.hf_reference import hf_greedy, hf_model

# case name -> (arch, make_tiny_model overrides)
CASES = {
    "llama": ("llama", {}),
    "mistral": ("mistral", {}),
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", {}),
    "mistral-window24": ("mistral", {"sliding_window": 24}),
    "qwen2-window16-layer1": ("qwen2", {"sliding_window": 16, "max_window_layers": 1}),
}
WINDOWED = [name for name, (_, kw) in CASES.items() if "sliding_window" in kw]


def test_every_registered_family_has_a_case():
    assert {arch for arch, _ in CASES.values()} == set(FAMILIES)


# Prompts of different lengths (in tokens), some longer than a block, one sharing a prefix with another.
PROMPT_LENGTHS = [3, 17, 40, 9, 33]
MAX_TOKENS = 24


def _prompts(vocab_size: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, vocab_size, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]
    prompts[3] = prompts[2][:20] + prompts[3]  # shares 20 tokens (one full block) with prompt 2
    return prompts


def _reference(model_dir: str, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    model = hf_model(model_dir)
    return [hf_greedy(model, prompt, max_tokens) for prompt in prompts]


@pytest.fixture(scope="module", params=list(CASES))
def arch_case(request, tiny_model_dir):
    arch, overrides = CASES[request.param]
    model_dir = str(tiny_model_dir(arch, **overrides))
    vocab_size = json.loads((tiny_model_dir(arch, **overrides) / "config.json").read_text())["vocab_size"]
    prompts = _prompts(vocab_size)
    return model_dir, prompts, _reference(model_dir, prompts, MAX_TOKENS)


GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)


def _run(model_dir: str, prompts, **options) -> tuple[list[list[int]], LLMEngine]:
    options = {"block_size": 16, "dtype": "float32", "device": "cpu", "num_kv_blocks": 256, **options}
    engine = LLMEngine(model_dir, **options)
    outs = engine.generate(prompts, GREEDY)
    assert all(o.finish_reason == "length" for o in outs)
    return [o.token_ids for o in outs], engine


def test_batch_of_mixed_lengths(arch_case):
    model_dir, prompts, expected = arch_case
    got, _ = _run(model_dir, prompts)
    assert got == expected


def test_chunked_prefill(arch_case):
    model_dir, prompts, expected = arch_case
    got, _ = _run(model_dir, prompts, max_num_batched_tokens=8)
    assert got == expected


def test_tiny_pool_preempts(arch_case):
    model_dir, prompts, expected = arch_case
    # 11 blocks of 8 tokens: the longest request alone needs 8 of them, all five together about 25.
    got, engine = _run(model_dir, prompts, block_size=8, num_kv_blocks=11)
    assert engine.stats().num_preemptions > 0
    assert got == expected


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_prefix_caching_on_and_off(arch_case, prefix_caching):
    model_dir, prompts, expected = arch_case
    engine = LLMEngine(
        model_dir,
        block_size=16,
        dtype="float32",
        device="cpu",
        num_kv_blocks=256,
        enable_prefix_caching=prefix_caching,
    )
    first = [o.token_ids for o in engine.generate(prompts, GREEDY)]
    # Second pass over the same prompts: with caching on every full prompt block is a hit.
    second = [o.token_ids for o in engine.generate(prompts, GREEDY)]
    assert first == expected and second == expected
    hits = engine.stats().prefix_cache_hits
    assert (hits > 0) == prefix_caching


def test_requests_join_mid_generation(arch_case):
    model_dir, prompts, expected = arch_case
    engine = LLMEngine(model_dir, block_size=16, dtype="float32", device="cpu", num_kv_blocks=256)
    tokens: dict[str, list[int]] = {}
    pending = list(enumerate(prompts))
    steps = 0
    while pending or engine.has_unfinished_requests():
        # A new request arrives every third step while others are mid-generation.
        if pending and steps % 3 == 0:
            i, prompt = pending.pop(0)
            engine.add_request(f"r{i}", prompt, GREEDY)
            tokens[f"r{i}"] = []
        for delta in engine.step():
            tokens[delta.request_id].extend(delta.new_token_ids)
        steps += 1
    assert [tokens[f"r{i}"] for i in range(len(prompts))] == expected


def test_static_mode_same_tokens(arch_case):
    model_dir, prompts, expected = arch_case
    got, _ = _run(model_dir, prompts, scheduling="static", max_num_seqs=2)
    assert got == expected


def test_n_greedy_forks_match(arch_case):
    # n > 1: the samples fork from the parent's last prefill step (copy-on-write of its partial block).
    model_dir, prompts, expected = arch_case
    engine = LLMEngine(model_dir, block_size=16, dtype="float32", device="cpu", num_kv_blocks=256)
    outs = engine.generate(prompts[1:3], GREEDY.model_copy(update={"n": 2}))
    assert [[o.token_ids for o in out.outputs] for out in outs] == [[e, e] for e in expected[1:3]]


@pytest.mark.parametrize("name", WINDOWED)
def test_window_changes_the_reference(name, tiny_model_dir):
    # The windowed cases above are only meaningful if full attention would have given other tokens.
    from transformers import AutoModelForCausalLM

    arch, overrides = CASES[name]
    model_dir = tiny_model_dir(arch, **overrides)
    prompts = _prompts(json.loads((model_dir / "config.json").read_text())["vocab_size"])
    windowed = _reference(str(model_dir), prompts, MAX_TOKENS)
    # Every layer full: the config's window off, and its layer types (qwen2 saves them) all full.
    config = json.loads((model_dir / "config.json").read_text())
    no_window = {"sliding_window": None}
    if "layer_types" in config:
        no_window["layer_types"] = ["full_attention"] * config["num_hidden_layers"]
    full = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, **no_window).eval()
    full.generation_config.eos_token_id = None
    assert full.config.sliding_window is None
    differ = sum(hf_greedy(full, p, MAX_TOKENS) != w for p, w in zip(prompts, windowed, strict=True))
    assert differ >= 2

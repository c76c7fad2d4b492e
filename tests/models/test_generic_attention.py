"""The generic path's pieces: the attention scope, per-layer facts read at load, auto dispatch, the Triton
backend under it, and the Llama family through it."""

from __future__ import annotations

import pytest
import torch

from engine import LLMEngine, SamplingParams
from engine.model_loader import load_model
from engine.models.generic.attention import Probe, attention_scope, conveyor_attention
from tests.helpers.hf_reference import greedy_agrees, hf_greedy, hf_model

TINY = {"hidden_size": 32, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "vocab_size": 320}


def test_scopes_do_not_nest():
    with attention_scope(Probe()):
        with pytest.raises(RuntimeError, match="already active"):
            with attention_scope(Probe()):
                pass
    with attention_scope(Probe()):  # the first one was cleared on exit
        pass


def test_attention_outside_a_scope_is_an_error():
    q = torch.zeros(1, 4, 2, 8)
    with pytest.raises(RuntimeError, match="outside attention_scope"):
        conveyor_attention(torch.nn.Module(), q, q, q, None)


def test_gemma2_layer_facts_from_module_and_config(tiny_model_dir):
    model, spec = load_model(tiny_model_dir("gemma2", **TINY, config_overrides={"sliding_window": 8}))
    config = model.hf.config
    scale = config.query_pre_attn_scalar**-0.5  # not head_dim ** -0.5: taken from the module
    assert [(a.window, a.softcap, a.scale) for a in model.layer_attention] == [
        (8, config.attn_logit_softcapping, pytest.approx(scale)),  # layer_types: sliding, full
        (None, config.attn_logit_softcapping, pytest.approx(scale)),
    ]
    assert (spec.num_layers, spec.num_heads, spec.num_kv_heads, spec.head_dim) == (2, 4, 2, 8)


def test_auto_keeps_the_llama_family_native(tiny_model_dir):
    model, _ = load_model(tiny_model_dir("llama", **TINY))
    assert type(model).__name__ == "LlamaForCausalLM"


def _prompts(n_tokens: list[int], seed: int = 2) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, TINY["vocab_size"], (n,), generator=g).tolist() for n in n_tokens]


def test_llama_through_the_generic_path_matches_native(tiny_model_dir):
    folder = str(tiny_model_dir("llama", **TINY))
    prompts = _prompts([5, 30, 12])
    greedy = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    runs = {}
    for impl in ("native", "transformers"):
        engine = LLMEngine(folder, model_impl=impl, dtype="float32", device="cpu", num_kv_blocks=64)
        runs[impl] = [o.token_ids for o in engine.generate(prompts, greedy)]
    assert type(engine.model).__name__ == "TransformersCausalLM"
    assert runs["transformers"] == runs["native"]


def test_triton_backend_windowed_and_soft_capped(tiny_model_dir):
    # Gemma 2 (window 4 on layer 0, soft-capped logits everywhere) on the Triton kernels, under the interpreter
    # on the CPU: tiny on purpose (the interpreter runs every program in Python).
    folder = tiny_model_dir("gemma2", **TINY, config_overrides={"sliding_window": 4})
    prompts = _prompts([3, 18])  # the second crosses a block
    reference = hf_model(folder)
    expected = [hf_greedy(reference, p, 4) for p in prompts]
    engine = LLMEngine(
        str(folder), attention_backend="triton", block_size=16, dtype="float32", device="cpu", num_kv_blocks=8
    )
    outs = engine.generate(prompts, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    for prompt, out, want in zip(prompts, outs, expected, strict=True):
        assert greedy_agrees(reference, prompt, out.token_ids, want)

"""The whole engine through the Triton kernels (the interpreter on a CPU) gives the torch path's tokens."""

from __future__ import annotations

import pytest

from engine import LLMEngine, SamplingParams


@pytest.mark.slow
def test_triton_backend_matches_torch(tiny_model_dir):
    model = str(tiny_model_dir("qwen3"))
    prompts = [list(range(3, 24)), list(range(40, 45)), list(range(100, 137))]
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    common = dict(num_kv_blocks=32, block_size=16, dtype="float32", device="cpu", max_num_batched_tokens=24)
    torch_out = LLMEngine(model, attention_backend="torch", **common).generate(prompts, params)
    triton_engine = LLMEngine(model, attention_backend="triton", **common)
    assert triton_engine.model.attn_backend.name == "triton"
    triton_out = triton_engine.generate(prompts, params)
    assert [o.token_ids for o in triton_out] == [o.token_ids for o in torch_out]


@pytest.mark.slow
def test_triton_backend_sliding_window_matches_torch(tiny_model_dir):
    # Mistral with a 20-token window, prompts of 37 and 21 tokens: chunked prefill after cached context,
    # prefill chunks and decodes all cut by the window (the torch path matches transformers on these).
    model = str(tiny_model_dir("mistral", sliding_window=20))
    prompts = [list(range(3, 40)), list(range(40, 45)), list(range(100, 121))]
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    common = dict(num_kv_blocks=32, block_size=16, dtype="float32", device="cpu", max_num_batched_tokens=24)
    torch_engine = LLMEngine(model, attention_backend="torch", **common)
    assert [layer.self_attn.window for layer in torch_engine.model.layers] == [20, 20]
    torch_out = torch_engine.generate(prompts, params)
    triton_out = LLMEngine(model, attention_backend="triton", **common).generate(prompts, params)
    assert [o.token_ids for o in triton_out] == [o.token_ids for o in torch_out]

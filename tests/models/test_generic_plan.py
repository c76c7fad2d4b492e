"""`conveyor plan` on configs the generic path runs: exact parameter counts (mixtures of experts, tied heads,
biases) and KV bytes from the explicit head_dim and KV heads, all from config.json alone."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine.capacity_plan import plan

TINY = {"hidden_size": 32, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "vocab_size": 320}


@pytest.mark.parametrize(
    ("arch", "extra", "kv_heads", "head_dim"),
    [
        ("qwen3_moe", {}, 2, 8),  # 4 experts per layer
        ("mixtral", {}, 2, 8),
        ("gemma2", {"head_dim": 16}, 2, 16),  # head_dim != hidden / heads
        ("gpt_neox", {}, 4, 8),  # multi-head KV: no num_key_value_heads in its config
    ],
)
def test_plan_matches_the_checkpoint(tiny_model_dir, arch, extra, kv_heads, head_dim):
    folder = tiny_model_dir(arch, **TINY, **extra)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    p = plan(folder, memory_bytes=1 << 30, dtype="float32", block_size=16)
    assert p.num_params == sum(t.numel() for t in model.parameters())
    assert p.weight_bytes == 4 * p.num_params
    assert p.kv_bytes_per_token == 2 * 2 * kv_heads * head_dim * 4  # layers * (K, V) * heads * dim * fp32


def test_plan_per_gpu_splits_what_the_loader_splits(tiny_model_dir):
    # Gemma 2 on 2 GPUs: every matrix halves (the vocabulary, 320, splits evenly), the norms stay whole.
    folder = tiny_model_dir("gemma2", **TINY)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    vectors = sum(t.numel() for t in model.parameters() if t.dim() == 1)
    one = plan(folder, memory_bytes=1 << 30, dtype="float32", block_size=16)
    two = plan(folder, memory_bytes=1 << 30, dtype="float32", block_size=16, tensor_parallel_size=2)
    assert 2 * two.params_per_gpu == one.num_params + vectors
    assert two.weight_bytes == 4 * two.params_per_gpu
    assert two.kv_bytes_per_token == one.kv_bytes_per_token // 2


def test_plan_refuses_a_generic_model_that_does_not_split(tiny_model_dir):
    with pytest.raises(ValueError, match="MixtralForCausalLM: mixture-of-experts layers"):
        plan(tiny_model_dir("mixtral", **TINY), memory_bytes=1 << 30, tensor_parallel_size=2)
    with pytest.raises(ValueError, match="Gemma2ForCausalLM: num_attention_heads=4 cannot be split evenly"):
        plan(tiny_model_dir("gemma2", **TINY), memory_bytes=1 << 30, tensor_parallel_size=3)

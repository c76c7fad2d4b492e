"""Capacity arithmetic: plan() from config.json alone, and KV pool sizing."""

from __future__ import annotations

import json

import pytest
import torch

from engine.capacity_plan import format_plan, plan
from engine.config import EngineConfig
from engine.distributed.rank_runner import rank_num_blocks
from engine.kv_cache import allocate_kv_pool, bytes_per_block, bytes_per_token, layer_views
from engine.model_loader import ModelSpec

LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": False,
}


def test_llama3_8b_plan(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA3_8B))
    p = plan(tmp_path, 80 * 2**30, dtype="bfloat16", block_size=16, seq_lens=(1024, 8192))
    assert p.num_params == 8_030_261_248  # the published 8.03 B
    assert p.weight_bytes == 2 * p.num_params
    assert p.kv_bytes_per_token == 128 * 1024  # 32 layers * 2 * 8 heads * 128 dims * 2 bytes
    assert p.kv_bytes_per_block == 2 * 2**20
    assert p.num_blocks == (80 * 2**30 - p.weight_bytes - p.activation_reserve_bytes) // (2 * 2**20)
    assert p.concurrency[1024] == p.num_blocks // 64
    assert p.concurrency[8192] == p.num_blocks // 512
    text = format_plan(p)
    assert "128.0 KiB" in text and "8.03B" in text
    assert "at most max_num_seqs=64" in text  # more fit in the pool than the scheduler runs at once
    with pytest.raises(ValueError, match="outside 1..max_model_len"):
        plan(tmp_path, 80 * 2**30, seq_lens=(100_000,))


def test_llama3_8b_plan_over_two_and_sixteen_gpus(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA3_8B))
    one = plan(tmp_path, 80 * 2**30, seq_lens=(1024,))
    two = plan(tmp_path, 80 * 2**30, seq_lens=(1024,), tensor_parallel_size=2)
    assert two.num_params == one.num_params
    # Everything halves but the 2 norms per layer and the final one, whole on each GPU.
    assert 2 * two.params_per_gpu == one.num_params + (2 * 32 + 1) * 4096
    assert two.weight_bytes == 2 * two.params_per_gpu
    assert two.kv_bytes_per_token == one.kv_bytes_per_token // 2  # 4 of the 8 KV heads per GPU
    assert two.blocks_fit == (80 * 2**30 - two.weight_bytes - two.activation_reserve_bytes) // (2**20)
    # Capped as the engine caps a pool: 2 x 64 sequences of 8192 tokens in 16-token blocks.
    assert two.num_blocks == 2 * 64 * 512 < two.blocks_fit and "(capped: 74130 fit" in format_plan(two)
    assert two.blocks_fit > 2 * one.num_blocks  # half the KV per token and room freed by the weights
    assert two.concurrency[1024] == two.num_blocks // 64
    assert "2 GPUs; every size below is per GPU" in format_plan(two) and "4.02B per GPU" in format_plan(two)
    # 16 GPUs, 8 KV heads: each KV head replicated on two GPUs, so KV per token is 1/8, not 1/16.
    sixteen = plan(tmp_path, 80 * 2**30, seq_lens=(1024,), tensor_parallel_size=16)
    assert sixteen.kv_bytes_per_token == one.kv_bytes_per_token // 8


@pytest.mark.parametrize(
    ("size", "message"),
    [
        (3, "num_attention_heads=32 cannot be split evenly over tensor_parallel_size=3"),
        (64, "num_attention_heads=32 cannot be split evenly over tensor_parallel_size=64"),
        (0, "tensor_parallel_size must be >= 1"),
    ],
)
def test_plan_refuses_a_split_the_model_cannot_take(tmp_path, size, message):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA3_8B))
    with pytest.raises(ValueError, match=message):
        plan(tmp_path, 80 * 2**30, tensor_parallel_size=size)


def test_plan_default_lengths_follow_max_model_len(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA3_8B))
    assert sorted(plan(tmp_path, 80 * 2**30, max_model_len=4096).concurrency) == [512, 2048, 4096]


def test_plan_reports_no_room(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA3_8B))
    p = plan(tmp_path / "config.json", 8 * 2**30)
    assert p.num_blocks == 0 and "no room" in format_plan(p)


SPEC = ModelSpec(2, 4, 2, 16, 64, 512, 2048, torch.float32, frozenset({1}))


class FreeMemory:
    def __init__(self, free: int) -> None:
        self.bytes = free

    def free(self) -> int:
        return self.bytes


def _blocks(device: FreeMemory | None, memory: float | None = None, reserve: int = 0) -> int:
    """The pool on the CPU (device None) or on a device with this much free memory, after a warm-up
    that measured `reserve`."""
    config = EngineConfig(model="m", block_size=16, max_num_seqs=10**6, kv_cache_memory=memory)
    return rank_num_blocks(config, SPEC, device, lambda _memory: reserve)


def test_kv_sizes_and_budget():
    assert bytes_per_token(SPEC) == 2 * 2 * 2 * 16 * 4
    assert bytes_per_token(SPEC, torch.bfloat16) == 256
    assert bytes_per_block(SPEC, 16) == 16 * 512
    assert _blocks(None) == 2**30 // (16 * 512)
    # The CPU has no device memory to read: the budget is the pool's own, nothing is measured.
    assert _blocks(None, memory=10 * 16 * 512 + 5, reserve=10**9) == 10
    with pytest.raises(ValueError, match="below one block"):
        _blocks(None, memory=100)


def test_cuda_budget_is_a_fraction_of_free_memory_less_the_measured_reserve_or_bytes():
    block = 16 * 512
    cuda = FreeMemory(1000 * block)
    assert _blocks(cuda) == 900  # default: 0.9 of what is free after the weights
    assert _blocks(cuda, reserve=100 * block + 1) == 799  # less the warm-up's peak
    assert _blocks(cuda, memory=0.5) == 500
    assert _blocks(cuda, memory=1.0) == 1000
    assert _blocks(cuda, memory=30 * block + 1, reserve=10**9) == 30  # above 1: bytes, the pool's own
    with pytest.raises(ValueError, match="below one block"):
        _blocks(cuda, memory=0.0001)
    with pytest.raises(ValueError, match="reserve of"):
        _blocks(cuda, reserve=900 * block)


def test_pool_views_are_per_layer_and_contiguous():
    pool = allocate_kv_pool(SPEC, 5, 8, "cpu")
    assert pool.shape == (2, 2, 5, 8, 2, 16)
    views = layer_views(pool)
    views[1][1][3, 2] = 7.0
    assert pool[1, 1, 3, 2].eq(7.0).all() and all(k.is_contiguous() and v.is_contiguous() for k, v in views)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])  # qwen3: head_dim is not hidden // heads
def test_plan_kv_bytes_per_token_equal_what_the_engine_allocates(tiny_model_dir, arch):
    from engine import LLMEngine

    model = tiny_model_dir(arch)
    llm = LLMEngine(str(model), num_kv_blocks=4, block_size=16, dtype="float32", device="cpu")
    pool = llm.runner.kv_pool  # [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]
    allocated_per_block = pool.numel() * pool.element_size() // 4
    p = plan(model, 2**30, dtype="float32", block_size=16)
    assert p.kv_bytes_per_token * 16 == p.kv_bytes_per_block == allocated_per_block
    # The right-sizing rule: a 1000-token user holds ceil(1000 / 16) = 63 of the engine's blocks.
    assert p.kv_bytes_per_user(1000) == 63 * allocated_per_block
    assert f"(ceil(1000 / 16) blocks x {allocated_per_block / 1024:.1f} KiB)" in format_plan(p)
    assert p.num_params == sum(t.numel() for t in llm.model.parameters())


def test_plan_refuses_an_architecture_the_engine_does_not_run(tmp_path):
    # Architectures outside the Llama family go to the generic path, which refuses state-space models.
    mamba = {"architectures": ["MambaForCausalLM"], "model_type": "mamba", "hidden_size": 64}
    (tmp_path / "config.json").write_text(json.dumps(mamba))
    with pytest.raises(ValueError, match="MambaForCausalLM: state-space or hybrid layers"):
        plan(tmp_path, 80 * 2**30)

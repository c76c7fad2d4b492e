"""A pool sized from memory is capped at PREFIX_CACHE_FACTOR x what max_num_seqs sequences of max_model_len
tokens can use; free GPU memory is a stand-in (an H200's ~140 GB, a tiny model)."""

from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig
from engine.core.block_pool import BlockPool
from engine.distributed.rank_runner import rank_num_blocks
from engine.kv_cache import bytes_per_block
from engine.kv_sizing import PREFIX_CACHE_FACTOR
from engine.model_loader import ModelSpec

SPEC = ModelSpec(
    num_layers=2,
    num_heads=4,
    num_kv_heads=1,
    head_dim=64,
    hidden_size=256,
    vocab_size=1000,
    max_position_embeddings=2048,
    dtype=torch.float16,
    eos_token_ids=frozenset({0}),
    tp_size=1,
)
FREE = 140 * 10**9


def no_reserve(_memory: object) -> int:  # the warm-up's measured peak, here none
    return 0


class H200:
    """The device memory the sizing reads: only free() is asked for when nothing is measured."""

    def free(self) -> int:
        return FREE


@pytest.fixture
def h200():
    return H200()


def test_a_memory_sized_pool_is_capped_at_what_the_batch_can_use(h200):
    config = EngineConfig(model="m", max_num_seqs=64, max_model_len=1000, block_size=16)
    fits = int(FREE * 0.9) // bytes_per_block(SPEC, 16)
    assert fits > 10**6  # what the pool would have been
    assert rank_num_blocks(config, SPEC, h200, no_reserve) == PREFIX_CACHE_FACTOR * 64 * 63


def test_the_cap_uses_the_models_length_when_max_model_len_is_unset(h200):
    config = EngineConfig(model="m", max_num_seqs=8, block_size=32)
    assert rank_num_blocks(config, SPEC, h200, no_reserve) == PREFIX_CACHE_FACTOR * 8 * (2048 // 32)


def test_a_smaller_budget_and_an_explicit_count_are_not_capped(h200):
    small = EngineConfig(
        model="m", max_num_seqs=64, max_model_len=1000, kv_cache_memory=10 * bytes_per_block(SPEC, 16)
    )
    assert rank_num_blocks(small, SPEC, h200, no_reserve) == 10
    explicit = EngineConfig(model="m", max_num_seqs=1, max_model_len=16, num_kv_blocks=5000)
    assert rank_num_blocks(explicit, SPEC, h200, no_reserve) == 5000


def test_the_block_pool_holds_one_object_per_capped_block(h200):
    """Construction builds one KVBlock per block: its cost follows the capped count, not the memory."""
    config = EngineConfig(model="m", max_num_seqs=4, max_model_len=256, block_size=16)
    n = rank_num_blocks(config, SPEC, h200, no_reserve)
    assert n == PREFIX_CACHE_FACTOR * 4 * 16
    assert len(BlockPool(n).blocks) == n

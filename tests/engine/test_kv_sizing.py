"""The one KV sizing rule (engine/kv_sizing.py): ints in, blocks out, no torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from engine.kv_sizing import (
    DEFAULT_CPU_BYTES,
    PREFIX_CACHE_FACTOR,
    activation_estimate,
    blocks_for_tokens,
    bytes_per_user,
    engine_memory,
    kv_bytes_per_block,
    kv_pool_size,
    measures_reserve,
    most_blocks_usable,
)


def test_importing_the_rule_does_not_import_torch():
    code = "import sys, engine.kv_sizing; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_bytes_per_block_and_per_user():
    # SmolLM2-135M in bf16: 30 layers, 3 KV heads of 64 dims.
    block = kv_bytes_per_block(16, num_layers=30, num_kv_heads=3, head_dim=64, itemsize=2)
    assert block == 16 * 30 * 2 * 3 * 64 * 2 == 368_640
    assert blocks_for_tokens(1000, 16) == 63 and blocks_for_tokens(1008, 16) == 63
    assert blocks_for_tokens(1009, 16) == 64
    assert bytes_per_user(1000, 16, block) == 63 * block  # whole blocks: the last one partly filled


def test_pool_is_memory_less_reserve_in_whole_blocks_capped():
    size = kv_pool_size(memory_bytes=1000, reserve_bytes=150, block_bytes=100, cap=10**6)
    assert (size.budget_bytes, size.fits, size.blocks, size.capped) == (850, 8, 8, False)
    capped = kv_pool_size(memory_bytes=10_000, reserve_bytes=0, block_bytes=100, cap=40)
    assert (capped.fits, capped.blocks, capped.capped) == (100, 40, True)
    none = kv_pool_size(memory_bytes=100, reserve_bytes=500, block_bytes=10, cap=10)
    assert (none.budget_bytes, none.blocks) == (0, 0)
    with pytest.raises(ValueError, match="bytes per block"):
        kv_pool_size(1000, 0, 0, 10)


def test_the_cap_is_prefix_cache_factor_full_length_batches():
    assert (
        most_blocks_usable(max_num_seqs=4, max_model_len=1000, block_size=16) == PREFIX_CACHE_FACTOR * 4 * 63
    )


def test_engine_memory_by_where_it_runs():
    assert engine_memory(None, None) == DEFAULT_CPU_BYTES  # CPU: an explicit budget, 1 GiB by default
    assert engine_memory(12345, None) == 12345
    assert engine_memory(None, 1000) == 900  # CUDA: 0.9 of the free memory
    assert engine_memory(0.5, 1000) == 500 and engine_memory(1.0, 1000) == 1000
    assert engine_memory(4096, 1000) == 4096  # above 1: bytes
    # Only a fraction of a device's memory is measured against; bytes and the CPU are the pool's own.
    assert measures_reserve(None, True) and measures_reserve(0.8, True)
    assert not measures_reserve(4096, True) and not measures_reserve(None, False)


def test_activation_estimate_counts_every_batched_token_and_fp32_logits():
    got = activation_estimate(
        max_num_batched_tokens=10,
        max_num_seqs=3,
        hidden_size=8,
        qkv_width=12,
        intermediate_size=20,
        vocab_size=100,
        itemsize=2,
    )
    assert got == 10 * (2 * 8 + 12 + 2 * 20) * 2 + 3 * 100 * 4

"""The one rule that sizes the KV pool, used by the engine and by `conveyor plan`: ints in, blocks out.

    bytes per block = block_size * num_layers * 2 (K and V) * num_kv_heads * head_dim * dtype bytes
    blocks          = (memory - reserve) // bytes per block, at most PREFIX_CACHE_FACTOR x the blocks that
                      max_num_seqs sequences of max_model_len tokens use
    per user        = ceil(tokens / block_size) blocks x bytes per block (a block is never shared out)

`memory` is what the pool and one step's transient tensors share; `reserve` is those tensors' peak:

    where                memory                                       reserve
    conveyor plan        the GPU's memory - the weights               an estimate (activation_estimate)
    engine on CUDA       kv_cache_memory x the free memory after      measured: the peak of a warm-up forward
                         the weights load (default 0.9)               at the largest steps (engine/warmup.py)
    engine, bytes given  kv_cache_memory bytes (CPU default 1 GiB)    0: the budget is the pool's own

On the CPU there is no device memory to read, so the pool gets the explicit budget, as before; an explicit
byte count on CUDA is likewise the pool's alone. No torch and no I/O here, so the rule is tested with ints.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_CPU_BYTES = 1 << 30  # 1 GiB
DEFAULT_CUDA_FRACTION = 0.9
# A pool sized from memory holds at most this many times what max_num_seqs sequences of max_model_len tokens
# can use at once: the rest of it only keeps freed prefix-cache blocks for reuse. Without a cap a tiny model
# on an H200 (0.9 of ~140 GB in 8 KiB blocks) asks for ~15M blocks, each a Python object in the block pool.
PREFIX_CACHE_FACTOR = 2


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, itemsize: int) -> int:
    """K and V of one token across all layers."""
    return num_layers * 2 * num_kv_heads * head_dim * itemsize


def kv_bytes_per_block(
    block_size: int, num_layers: int, num_kv_heads: int, head_dim: int, itemsize: int
) -> int:
    return block_size * kv_bytes_per_token(num_layers, num_kv_heads, head_dim, itemsize)


def blocks_for_tokens(tokens: int, block_size: int) -> int:
    """Blocks a sequence of `tokens` tokens holds (the last one partly filled)."""
    return -(-tokens // block_size)


def bytes_per_user(tokens: int, block_size: int, block_bytes: int) -> int:
    """KV memory one concurrent sequence of `tokens` tokens takes: whole blocks."""
    return blocks_for_tokens(tokens, block_size) * block_bytes


def activation_estimate(
    *,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    hidden_size: int,
    qkv_width: int,
    intermediate_size: int,
    vocab_size: int,
    itemsize: int,
) -> int:
    """One step's transient tensors, estimated from the shapes (the engine measures instead, on CUDA): for
    every batched token the hidden state, residual, q/k/v and the gate/up output in the model dtype, plus
    float32 logits for every sampled row."""
    per_token = 2 * hidden_size + qkv_width + 2 * intermediate_size
    return max_num_batched_tokens * per_token * itemsize + max_num_seqs * vocab_size * 4


def most_blocks_usable(max_num_seqs: int, max_model_len: int, block_size: int) -> int:
    """The cap on a memory-sized pool: PREFIX_CACHE_FACTOR x max_num_seqs full-length sequences' blocks."""
    return PREFIX_CACHE_FACTOR * max_num_seqs * blocks_for_tokens(max_model_len, block_size)


def engine_memory(kv_cache_memory: float | None, free_bytes: int | None) -> int:
    """The memory the engine's pool (and, when measured, its step) may take, from the kv_cache_memory option.
    free_bytes: the device's free memory after the weights load, or None where there is none to read (CPU)."""
    if free_bytes is None:
        return int(DEFAULT_CPU_BYTES if kv_cache_memory is None else kv_cache_memory)
    fraction = DEFAULT_CUDA_FRACTION if kv_cache_memory is None else kv_cache_memory
    return int(free_bytes * fraction) if fraction <= 1 else int(fraction)


def measures_reserve(kv_cache_memory: float | None, on_device: bool) -> bool:
    """Whether the engine measures the step's peak before sizing: on a device with memory to read, when the
    budget is a fraction of it (an explicit byte count is the pool's alone)."""
    return on_device and (kv_cache_memory is None or kv_cache_memory <= 1)


@dataclass(frozen=True)
class PoolSize:
    budget_bytes: int  # what the pool may take: memory - reserve (0 when the reserve is larger)
    fits: int  # blocks that fit in the budget
    blocks: int  # the pool: `fits`, capped at most_blocks_usable

    @property
    def capped(self) -> bool:
        return self.blocks < self.fits


def kv_pool_size(memory_bytes: int, reserve_bytes: int, block_bytes: int, cap: int) -> PoolSize:
    """The rule: (memory - reserve) // block_bytes, at most `cap` (most_blocks_usable)."""
    if block_bytes < 1:
        raise ValueError(f"bytes per block must be >= 1, got {block_bytes}")
    budget = max(0, memory_bytes - reserve_bytes)
    fits = budget // block_bytes
    return PoolSize(budget, fits, min(fits, cap))

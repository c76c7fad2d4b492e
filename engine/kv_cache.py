"""Sizing and allocating the paged KV pool.

One tensor holds every layer's K and V so that block copies and sizing are single operations:

    pool: [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]
    layer l -> (pool[l, 0], pool[l, 1]), each [num_blocks, block_size, num_kv_heads, head_dim] (contiguous)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import structlog
import torch

if TYPE_CHECKING:
    from engine.model_loader import ModelSpec

log = structlog.get_logger("conveyor.engine")

DEFAULT_CPU_BYTES = 1 << 30  # 1 GiB
DEFAULT_CUDA_FRACTION = 0.9
# A pool sized from memory holds at most this many times what max_num_seqs sequences of max_model_len tokens
# can use at once: the rest of it only keeps freed prefix-cache blocks for reuse. Without a cap a tiny model
# on an H200 (0.9 of ~140 GB in 8 KiB blocks) asks for ~15M blocks, each a Python object in the block pool.
PREFIX_CACHE_FACTOR = 2


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, itemsize: int) -> int:
    """K and V of one token across all layers: the one formula, shared with `conveyor plan`."""
    return num_layers * 2 * num_kv_heads * head_dim * itemsize


def bytes_per_token(spec: ModelSpec, dtype: torch.dtype | None = None) -> int:
    """K and V of one token across all layers, in the pool's dtype (default: the model's)."""
    itemsize = torch.empty((), dtype=dtype or spec.dtype).element_size()
    return kv_bytes_per_token(spec.num_layers, spec.num_kv_heads, spec.head_dim, itemsize)


def bytes_per_block(spec: ModelSpec, block_size: int, dtype: torch.dtype | None = None) -> int:
    return block_size * bytes_per_token(spec, dtype)


def num_blocks_for_budget(
    spec: ModelSpec,
    block_size: int,
    device: torch.device | str,
    memory: float | None = None,
    dtype: torch.dtype | None = None,
) -> int:
    """How many blocks fit. CPU: `memory` bytes (None -> 1 GiB). CUDA: `memory` <= 1 is a fraction of the
    free memory now (call after the weights are loaded; None -> 0.9), > 1 is bytes. Raises if not one fits."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        fraction = DEFAULT_CUDA_FRACTION if memory is None else memory
        budget = int(free * fraction) if fraction <= 1 else int(fraction)
    else:
        budget = int(DEFAULT_CPU_BYTES if memory is None else memory)
    per_block = bytes_per_block(spec, block_size, dtype)
    n = budget // per_block
    if n < 1:
        raise ValueError(f"KV budget of {budget} bytes is below one block ({per_block} bytes)")
    return n


def most_blocks_usable(max_num_seqs: int, max_model_len: int, block_size: int) -> int:
    """The cap on a memory-sized pool: PREFIX_CACHE_FACTOR x max_num_seqs full-length sequences' blocks."""
    return PREFIX_CACHE_FACTOR * max_num_seqs * -(-max_model_len // block_size)


def capped_num_blocks(fits: int, max_num_seqs: int, max_model_len: int, block_size: int) -> int:
    """min(fits, most_blocks_usable(...)), with a log line when the cap cuts the pool."""
    cap = most_blocks_usable(max_num_seqs, max_model_len, block_size)
    if fits <= cap:
        return fits
    log.info(
        "KV pool capped at what the batch can use",
        blocks=cap,
        fit_in_memory=fits,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        prefix_cache_factor=PREFIX_CACHE_FACTOR,
    )
    return cap


def allocate_kv_pool(
    spec: ModelSpec,
    num_blocks: int,
    block_size: int,
    device: torch.device | str,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    # Zeroed so that masked-out padding positions never hold NaN bit patterns (0 * NaN would leak).
    shape = (spec.num_layers, 2, num_blocks, block_size, spec.num_kv_heads, spec.head_dim)
    return torch.zeros(shape, dtype=dtype or spec.dtype, device=device)


def layer_views(pool: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per-layer (k_cache, v_cache) views into the pool."""
    return [(pool[i, 0], pool[i, 1]) for i in range(pool.shape[0])]

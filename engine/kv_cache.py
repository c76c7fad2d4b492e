"""Allocating the paged KV pool (how many blocks it gets: engine/kv_sizing.py, the one rule).

One tensor holds every layer's K and V so that block copies and sizing are single operations:

    pool: [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]
    layer l -> (pool[l, 0], pool[l, 1]), each [num_blocks, block_size, num_kv_heads, head_dim] (contiguous)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from engine.kv_sizing import kv_bytes_per_token

if TYPE_CHECKING:
    from engine.model_loader import ModelSpec


def bytes_per_token(spec: ModelSpec, dtype: torch.dtype | None = None) -> int:
    """K and V of one token across all layers, in the pool's dtype (default: the model's)."""
    itemsize = torch.empty((), dtype=dtype or spec.dtype).element_size()
    return kv_bytes_per_token(spec.num_layers, spec.num_kv_heads, spec.head_dim, itemsize)


def bytes_per_block(spec: ModelSpec, block_size: int, dtype: torch.dtype | None = None) -> int:
    return block_size * bytes_per_token(spec, dtype)


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

"""Scatter this step's new K/V rows into the paged cache.

    slot = block_id * block_size + offset_in_block        (slot -1: padding token, skipped)
    k_cache[block_id, offset_in_block, h, :] = key[t, h, :]

One program per token covers all its KV heads. Slot arithmetic is int64: with ~2M blocks of
16 x 8 x 128 elements, block_id * block_stride is past 2**31.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import check, check_cache, next_pow2


@triton.jit
def _write_kv_kernel(
    key_ptr,  # [T, H, D]
    value_ptr,  # [T, H, D]
    k_cache_ptr,  # [num_blocks, block_size, H, D]
    v_cache_ptr,  # [num_blocks, block_size, H, D]
    slot_ptr,  # [T] int64
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cb,
    stride_cs,
    stride_ch,
    num_heads,
    head_dim,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot < 0:
        return
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (h < num_heads) & (d < head_dim)
    k = tl.load(key_ptr + t * stride_kt + h * stride_kh + d, mask=mask)
    v = tl.load(value_ptr + t * stride_vt + h * stride_vh + d, mask=mask)
    dst = block * stride_cb + offset * stride_cs + h * stride_ch + d
    tl.store(k_cache_ptr + dst, k, mask=mask)
    tl.store(v_cache_ptr + dst, v, mask=mask)


def _validate(key, value, k_cache, v_cache, slot_mapping) -> None:
    check_cache("k_cache", k_cache)
    check_cache("v_cache", v_cache)
    check(
        k_cache.shape == v_cache.shape,
        lambda: f"k_cache {tuple(k_cache.shape)} != v_cache {tuple(v_cache.shape)}",
    )
    check(k_cache.stride() == v_cache.stride(), "k_cache and v_cache must have the same strides")
    check(key.dim() == 3, lambda: f"key must be [num_tokens, num_kv_heads, head_dim], got {tuple(key.shape)}")
    check(key.shape == value.shape, lambda: f"key {tuple(key.shape)} != value {tuple(value.shape)}")
    check(
        key.shape[1:] == k_cache.shape[2:],
        lambda: f"key heads/head_dim {tuple(key.shape[1:])} != cache {tuple(k_cache.shape[2:])}",
    )
    check(
        key.dtype == value.dtype == k_cache.dtype == v_cache.dtype,
        lambda: (
            f"dtypes differ: key {key.dtype}, value {value.dtype}, k_cache {k_cache.dtype}, v_cache {v_cache.dtype}"
        ),
    )
    check(key.stride(2) == 1 and value.stride(2) == 1, "key/value head_dim must be contiguous")
    check(slot_mapping.dtype == torch.int64, lambda: f"slot_mapping must be int64, got {slot_mapping.dtype}")
    check(
        slot_mapping.dim() == 1 and slot_mapping.shape[0] == key.shape[0],
        lambda: f"slot_mapping must be [{key.shape[0]}], got {tuple(slot_mapping.shape)}",
    )
    devices = {t.device for t in (key, value, k_cache, v_cache, slot_mapping)}
    check(len(devices) == 1, lambda: f"all tensors must be on one device, got {devices}")


def write_kv(
    key: torch.Tensor,  # [T, H, D]
    value: torch.Tensor,  # [T, H, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, H, D]
    v_cache: torch.Tensor,  # [num_blocks, block_size, H, D]
    slot_mapping: torch.Tensor,  # [T] int64, -1 = padding
) -> None:
    _validate(key, value, k_cache, v_cache, slot_mapping)
    num_tokens, num_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    _write_kv_kernel[(num_tokens,)](
        key,
        value,
        k_cache,
        v_cache,
        slot_mapping,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        num_heads,
        head_dim,
        BLOCK_SIZE=k_cache.shape[1],
        BLOCK_H=next_pow2(num_heads),
        BLOCK_D=next_pow2(head_dim),
    )


def write_kv_ref(key, value, k_cache, v_cache, slot_mapping) -> None:
    """Pure torch: index_put over the flattened slot axis, padding rows dropped."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    block_size = k_cache.shape[1]
    blocks, offsets = slots // block_size, slots % block_size
    k_cache[blocks, offsets] = key[keep]
    v_cache[blocks, offsets] = value[keep]

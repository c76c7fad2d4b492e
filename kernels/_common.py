"""Small helpers shared by the kernel launchers."""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def interpreting() -> bool:
    """True when Triton runs kernels on the CPU interpreter (tl.dot on fp16/bf16 is wrong there)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def check(cond: bool, msg: str | Callable[[], str]) -> None:
    """Raise ValueError(msg) unless cond. A message that formats values is passed as a lambda, built only on
    failure: launchers run these on every call, per layer, where f-strings built eagerly would cost more than
    the checks."""
    if not cond:
        raise ValueError(msg if isinstance(msg, str) else msg())


def check_cache(name: str, cache: torch.Tensor) -> None:
    """k/v cache: [num_blocks, block_size, num_kv_heads, head_dim], last dim contiguous."""
    check(
        cache.dim() == 4,
        lambda: f"{name} must be [num_blocks, block_size, num_kv_heads, head_dim], got {tuple(cache.shape)}",
    )
    check(cache.dtype in FLOAT_DTYPES, lambda: f"{name} dtype must be fp16/bf16/fp32, got {cache.dtype}")
    check(
        cache.stride(3) == 1,
        lambda: f"{name} last dim (head_dim) must be contiguous, got strides {cache.stride()}",
    )

"""Bytes one [N, K] linear weight takes in each quantization, as the kernels store it (for `conveyor plan`).

none   N*K*item
int8   N*K (int8) + N*item (one scale per row, activation dtype)
int4   N*K/2 (two codes a byte) + K/32*N*2*item (a scale and a zero point per group of 32)
fp8    N*K (e4m3) + N*4 (float32 scales)
"""

from __future__ import annotations

from engine.quant.int4 import GROUP_SIZE

PLAN_QUANTIZATIONS = ("none", "int8", "int4", "fp8")


def linear_bytes(n: int, k: int, quantization: str, item: int) -> int:
    if quantization == "none":
        return n * k * item
    if quantization == "int8":
        return n * k + n * item
    if quantization == "int4":
        return n * k // 2 + -(-k // GROUP_SIZE) * n * 2 * item
    if quantization == "fp8":
        return n * k + n * 4
    raise ValueError(f"quantization must be one of {', '.join(PLAN_QUANTIZATIONS)}; got {quantization!r}")

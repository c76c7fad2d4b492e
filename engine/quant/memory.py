"""Bytes one [N, K] linear weight takes in each quantization, as the kernels store it (for `conveyor plan`).

none   N*K*item
int8   N*K (int8) + N*item (one scale per row, activation dtype)
int4   N*K/2 (two codes a byte) + K/32*N*2*item (a scale and a zero point per group of 32)
fp8    N*K (e4m3) + N*4 (float32 scales)

A GGUF file served with int4 also gets its LM head from the file's blocks (engine/quant/lm_head.py):
`int4_head_extra_bytes` is what that adds over counting the head in the serving dtype.
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


def int4_head_extra_bytes(qtype: str, rows: int, hidden: int, tied: bool, item: int) -> int:
    """Bytes one rank's LM head [rows, hidden] served from the file's `qtype` blocks on the int4 kernel adds
    over the head counted in the serving dtype: a tied head gets its own kernel beside the embedding's table;
    an untied one replaces its table. 0 where the head stays as loaded (another type)."""
    from engine.quant.lm_head import HEAD_TYPES

    if qtype not in HEAD_TYPES:
        return 0
    k = 2 * hidden if qtype == "Q8_0" else hidden  # Q8_0: the pair of int4 halves
    return linear_bytes(rows, k, "int4", item) - (0 if tied else rows * hidden * item)

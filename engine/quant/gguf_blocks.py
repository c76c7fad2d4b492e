"""GGUF's quantized blocks turned into our kernels' inputs with no second rounding.

A block covers 32 consecutive weights of one row (llama.cpp's QK4_0 = QK4_1 = QK8_0 = 32):

    Q4_0  18 bytes: d fp16, 16 bytes of nibbles       w = d * (q - 8)
    Q4_1  20 bytes: d fp16, m fp16, 16 bytes          w = d * q + m
    Q8_0  34 bytes: d fp16, 32 int8                   w = d * q

Nibble j of a block's 16 bytes: the low half of byte j is weight j, the high half weight j + 16.

Q4_0 and Q4_1 are int4 with group 32 in torch's convention w = (q - 8) * scale + zero (engine/quant/int4.py):
scale = d and zero = 0 (Q4_0) or m + 8 * d (Q4_1). In float32 both give the same float32 value as
`gguf.quants.dequantize` (d * q is exact, m + 8 * d is exact for fp16 inputs of ordinary range, so one
rounding of the same sum either way); tests check it on a real file. With bfloat16 or float16 activations
the scales and zeros are rounded to that dtype, as every weight is when a model is served in it.

Q8_0 has a scale per 32 weights, torch's int8 op one per output row: a Q8_0 tensor is int8 without a second
rounding only when each row's 32-blocks share one scale (`q8_0_per_channel`); otherwise it stays
dequantized (re-rounding to one scale per row would be a second rounding).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

BLOCK = 32
BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}
INT4_TYPES = ("Q4_0", "Q4_1")


def qtype_name(qtype: Any) -> str:
    """A gguf.GGMLQuantizationType (or its name) as its name: engine code does not import gguf."""
    return str(getattr(qtype, "name", qtype))


def _blocks(qtype: str, data: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """[rows, bytes_per_row] uint8 -> [rows, K / 32, block bytes], after checking the sizes agree."""
    rows, k = shape
    if k % BLOCK:
        raise ValueError(f"{qtype}: row length {k} is not a multiple of {BLOCK}")
    want = (rows, k // BLOCK * BLOCK_BYTES[qtype])
    if data.dtype != np.uint8 or tuple(data.shape) != want:
        raise ValueError(
            f"{qtype}: want uint8 blocks {want} for a [{rows}, {k}] weight, got {data.dtype} {data.shape}"
        )
    return np.ascontiguousarray(data).reshape(rows, k // BLOCK, BLOCK_BYTES[qtype])


def _f16(b: np.ndarray) -> np.ndarray:
    """[..., 2] uint8 -> [...] float32 from little-endian fp16."""
    return np.ascontiguousarray(b).view(np.float16)[..., 0].astype(np.float32)


def q4_to_int4(
    qtype: Any, data: np.ndarray, shape: tuple[int, int]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q4_0 / Q4_1 blocks -> (codes int32 [N, K] in 0..15, scale float32 [N, K/32], zero float32 [N, K/32])."""
    name = qtype_name(qtype)
    if name not in INT4_TYPES:
        raise ValueError(f"not an int4 GGUF type: {name}")
    b = _blocks(name, data, shape)
    d = _f16(b[..., 0:2])  # [N, K/32]
    nibbles = b[..., 2:18] if name == "Q4_0" else b[..., 4:20]  # [N, K/32, 16]
    codes = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=-1)  # [N, K/32, 32]: weights 0..15, 16..31
    zero = np.zeros_like(d) if name == "Q4_0" else _f16(b[..., 2:4]) + np.float32(8) * d
    n, k = shape
    return (
        torch.from_numpy(codes.reshape(n, k).astype(np.int32)),
        torch.from_numpy(d),
        torch.from_numpy(zero),
    )


def q8_0_to_int8(data: np.ndarray, shape: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Q8_0 blocks -> (q int8 [N, K], block scales float32 [N, K/32])."""
    b = _blocks("Q8_0", data, shape)
    d = _f16(b[..., 0:2])
    q = np.ascontiguousarray(b[..., 2:]).view(np.int8).reshape(shape)
    return torch.from_numpy(q.copy()), torch.from_numpy(d)


def q8_0_per_channel(d: torch.Tensor) -> torch.Tensor | None:
    """One scale per row [N] when every block of each row has the same scale, else None."""
    return d[:, 0].clone() if bool((d == d[:, :1]).all()) else None

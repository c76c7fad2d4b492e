"""int4 weight-only linear: 4-bit codes in groups along K, one scale and one zero point per group.

torch's packed int4 matmul dequantizes a code q in 0..15 of group g of output row n as

    w[n, k] = (q[n, k] - 8) * scale[n, g] + zero[n, g]          (checked against the op in tests)

so a group quantized over [lo, hi] with step s = (hi - lo) / 15 and w = lo + q * s has zero = lo + 8 * s.
The packed layout differs by device: `_convert_weight_to_int4pack_for_cpu` takes the int32 codes [N, K]
on the CPU; `_convert_weight_to_int4pack` takes them two per byte [N, K / 2] (high nibble first) on CUDA,
tiled for its kernel. scales_and_zeros: [K / group, N, 2] in the activation dtype (CUDA: bfloat16 only).
"""

from __future__ import annotations

import torch
from torch import nn

GROUP_SIZE = 32  # a GGUF Q4_0/Q4_1 block is 32 weights: the same grouping serves its blocks as they are
CUDA_INNER_K_TILES = (8, 4, 2)  # the CUDA packing's tile counts, largest first


def int4_unfit_reason(n: int, k: int, group: int, device: torch.device, dtype: torch.dtype) -> str | None:
    """Why an [n, k] weight cannot take the int4 op on this device and dtype (None: it can)."""
    if k % group:
        return f"in_features {k} is not a multiple of the group size {group}"
    if device.type == "cpu":
        if n % 16:
            return f"out_features {n} is not a multiple of 16 (the CPU int4 packing's tile)"
        if dtype not in (torch.float32, torch.bfloat16, torch.float16):
            return f"the CPU int4 op takes float32, bfloat16 or float16 activations, not {dtype}"
        return None
    if device.type == "cuda":
        if dtype != torch.bfloat16:
            return f"the CUDA int4 op takes bfloat16 activations only, not {dtype} (use --dtype bfloat16)"
        if n % 8 or _cuda_tiles(k) is None:
            return f"[{n}, {k}] does not fit the CUDA int4 tiles (out % 8, in % 32)"
        return None
    return f"no int4 op on device {device.type}"


def _cuda_tiles(k: int) -> int | None:
    return next((t for t in CUDA_INNER_K_TILES if k % (t * 16) == 0), None)


def quantize_int4(
    w: torch.Tensor, group: int = GROUP_SIZE
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric min/max quantization of w [N, K] -> (codes int32 [N, K] in 0..15, scale [N, K/group],
    zero [N, K/group]) in float32, in the op's convention (see the module docstring)."""
    n, k = w.shape
    g = w.float().reshape(n, k // group, group)
    lo, hi = g.amin(-1), g.amax(-1)
    scale = ((hi - lo) / 15).clamp(min=torch.finfo(torch.float32).tiny)
    codes = ((g - lo[..., None]) / scale[..., None]).round().clamp(0, 15).to(torch.int32).reshape(n, k)
    return codes, scale, lo + 8 * scale


def dequantize_int4(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """The op's reading of the codes: [N, K] float32. The CPU op rounds once (a fused multiply-add), so
    this computes in float64 and rounds to float32 once, to match it bit for bit."""
    group = codes.shape[1] // scale.shape[1]
    s = scale.double().repeat_interleave(group, 1)
    z = zero.double().repeat_interleave(group, 1)
    return ((codes.double() - 8) * s + z).float()


class Int4Weight(nn.Module):
    """x [M, K] -> x @ W.T [M, N] with W held as packed int4 codes and per-group scales and zero points."""

    def __init__(
        self,
        codes: torch.Tensor,  # [N, K] int32 in 0..15
        scale: torch.Tensor,  # [N, K / group]
        zero: torch.Tensor,  # [N, K / group]
        dtype: torch.dtype,  # the activations' (and the scales') dtype
        device: torch.device,
    ) -> None:
        super().__init__()
        self.out_features, self.in_features = codes.shape
        self.group = self.in_features // scale.shape[1]
        reason = int4_unfit_reason(self.out_features, self.in_features, self.group, device, dtype)
        if reason is not None:
            raise ValueError(f"int4: {reason}")
        codes = codes.to(device=device, dtype=torch.int32)
        self.on_cuda = device.type == "cuda"
        if self.on_cuda:
            pairs = (codes[:, ::2] << 4 | codes[:, 1::2]).to(torch.uint8)  # [N, K / 2], high nibble first
            packed = torch.ops.aten._convert_weight_to_int4pack(pairs, _cuda_tiles(self.in_features))
        else:
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
        self.packed: torch.Tensor
        self.scales_and_zeros: torch.Tensor
        self.register_buffer("packed", packed)
        # [K / group, N, 2]: scale and zero of group g of row n at [g, n].
        sz = torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous()
        self.register_buffer("scales_and_zeros", sz.to(device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [M, K] -> [M, N]
        if x.dtype != self.scales_and_zeros.dtype:
            raise TypeError(f"int4 layer built for {self.scales_and_zeros.dtype} activations, got {x.dtype}")
        if self.on_cuda:
            return torch.ops.aten._weight_int4pack_mm(x, self.packed, self.group, self.scales_and_zeros)
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed, self.group, self.scales_and_zeros)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, group={self.group}"

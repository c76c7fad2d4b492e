"""Building blocks shared by the Llama family: RMSNorm, rotary embedding, gated MLP."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.distributed.group import TPGroup
from engine.distributed.parallel_linear import RowParallelLinear, gate_up_linear
from engine.models.config import ModelArgs, rope_inv_freq


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., dim]
        # Statistics in float32, scale applied after casting back: same rounding as transformers.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class Rotary(nn.Module):
    """Non-interleaved ("rotate half") rotary embedding; cos/sin computed once per forward, not per layer."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        # [head_dim // 2] float32, kept off the module's buffers so meta-device construction leaves it intact.
        self.inv_freq = rope_inv_freq(args)

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # positions: [T] int64 -> cos, sin: [T, 1, head_dim // 2] float32 (broadcast over heads)
        if self.inv_freq.device != positions.device:
            self.inv_freq = self.inv_freq.to(positions.device)
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        return freqs.cos()[:, None, :], freqs.sin()[:, None, :]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [T, heads, head_dim]; halves rotated as (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin).
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class GatedMLP(nn.Module):
    """down(silu(gate(x)) * up(x)) with gate and up fused into one matmul. Under tensor parallelism each
    rank holds intermediate / size columns of gate and up and the matching rows of down (one all_reduce)."""

    def __init__(self, hidden: int, intermediate: int, tp: TPGroup | None = None) -> None:
        super().__init__()
        tp = tp or TPGroup.single()
        self.gate_up_proj = gate_up_linear(hidden, intermediate, tp)
        self.intermediate = self.gate_up_proj.out_features // 2  # this rank's share
        self.down_proj = RowParallelLinear(intermediate, hidden, False, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [T, hidden]
        gate, up = self.gate_up_proj(x).split(self.intermediate, dim=-1)
        return self.down_proj(F.silu(gate) * up)

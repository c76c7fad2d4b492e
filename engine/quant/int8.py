"""int8 weight-only linear: one symmetric scale per output channel.

    w[n, k] = q[n, k] * scale[n],  q int8 in -127..127

through `torch.ops.aten._weight_int8pack_mm(x [M, K], q [N, K], scale [N])`, which takes float32, bfloat16
or float16 activations with the scales in the same dtype.
"""

from __future__ import annotations

import torch
from torch import nn

INT8_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric absmax per output channel: w [N, K] -> (q int8 [N, K], scale float32 [N])."""
    wf = w.float()
    scale = (wf.abs().amax(-1) / 127).clamp(min=torch.finfo(torch.float32).tiny)
    q = (wf / scale[:, None]).round().clamp(-127, 127).to(torch.int8)
    return q, scale


class Int8Weight(nn.Module):
    """x [M, K] -> x @ (q * scale[:, None]).T [M, N]."""

    def __init__(
        self, q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, device: torch.device
    ) -> None:
        super().__init__()
        if dtype not in INT8_DTYPES:
            raise ValueError(f"int8: activations must be float32, bfloat16 or float16, not {dtype}")
        if q.dtype != torch.int8 or q.dim() != 2 or scale.shape != (q.shape[0],):
            raise ValueError(
                f"int8: want q int8 [N, K] and scale [N], got {q.dtype} {tuple(q.shape)}, {tuple(scale.shape)}"
            )
        self.out_features, self.in_features = q.shape
        self.q: torch.Tensor
        self.scale: torch.Tensor
        self.register_buffer("q", q.to(device).contiguous())
        self.register_buffer("scale", scale.to(device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [M, K] -> [M, N]
        if x.dtype != self.scale.dtype:
            raise TypeError(f"int8 layer built for {self.scale.dtype} activations, got {x.dtype}")
        return torch.ops.aten._weight_int8pack_mm(x, self.q, self.scale)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}"

"""fp8 (e4m3) linear: weights with one scale per output channel, activations with one scale per token.

    y = (xq * sx[:, None]) @ (wq * sw[:, None]).T,  xq, wq float8_e4m3fn (largest value 448)

The real path is `torch._scaled_mm` with row-wise scales, on CUDA GPUs of compute capability 8.9 or newer
(Ada, Hopper): it needs in_features and out_features multiples of 16 and gives bfloat16 (cast to the
model's dtype). `emulate=True` rounds weights and activations to e4m3 the same way and multiplies in
float32: it runs anywhere, for fidelity measurements only (it also keeps the rounded weights in float32).
"""

from __future__ import annotations

import torch
from torch import nn

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
MIN_CAPABILITY = (8, 9)


def fp8_device_refusal(device: torch.device) -> str | None:
    """Why this device cannot run the fp8 matmul (None: it can)."""
    if device.type != "cuda":
        return f"quantization fp8 needs a CUDA GPU of compute capability 8.9+ (torch._scaled_mm); this engine runs on {device.type}"
    cap = torch.cuda.get_device_capability(device)
    if cap < MIN_CAPABILITY:
        return f"quantization fp8 needs compute capability 8.9+ (torch._scaled_mm); {device} is {cap[0]}.{cap[1]}"
    return None


def fp8_shape_refusal(n: int, k: int) -> str | None:
    if n % 16 or k % 16:
        return f"fp8 needs in and out features that are multiples of 16, got [{n}, {k}]"
    return None


def quantize_fp8(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-wise absmax: t [R, C] -> (e4m3 [R, C], float32 scale [R]) with t ~ q * scale[:, None]."""
    tf = t.float()
    scale = (tf.abs().amax(-1) / E4M3_MAX).clamp(min=torch.finfo(torch.float32).tiny)
    return (tf / scale[:, None]).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3), scale


class Fp8Weight(nn.Module):
    """x [M, K] -> [M, N]; weights e4m3 [N, K] with float32 scales [N]."""

    def __init__(self, w: torch.Tensor, device: torch.device, emulate: bool = False) -> None:
        super().__init__()
        self.out_features, self.in_features = w.shape
        self.emulate = emulate
        if not emulate:
            reason = fp8_device_refusal(device) or fp8_shape_refusal(*w.shape)
            if reason is not None:
                raise ValueError(reason)
        q, scale = quantize_fp8(w)
        self.q: torch.Tensor
        self.scale: torch.Tensor
        self.register_buffer("q", q.to(device))
        self.register_buffer("scale", scale.to(device))
        # The emulation multiplies by the rounded weights in float32, made once rather than per call.
        self.emulated = (q.float() * scale[:, None]).to(device) if emulate else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [M, K] -> [M, N]
        xq, xs = quantize_fp8(x)
        if self.emulated is not None:
            return ((xq.float() * xs[:, None]) @ self.emulated.t()).to(x.dtype)
        y = torch._scaled_mm(
            xq, self.q.t(), scale_a=xs[:, None], scale_b=self.scale[None, :], out_dtype=torch.bfloat16
        )
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, emulate={self.emulate}"

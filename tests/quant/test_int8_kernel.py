"""int8 kernel: per-channel symmetric quantization through aten._weight_int8pack_mm (CPU)."""

from __future__ import annotations

import pytest
import torch

from engine.quant.int8 import Int8Weight, quantize_int8

CPU = torch.device("cpu")


def test_quantize_int8_roundtrip_is_within_half_a_step():
    w = torch.randn(32, 64)
    q, scale = quantize_int8(w)
    assert q.dtype == torch.int8 and q.abs().max() <= 127
    assert ((q.float() * scale[:, None] - w).abs() <= scale[:, None] / 2 + 1e-7).all()


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2), (torch.float16, 3e-3)])
def test_forward_matches_the_dequantized_weight(dtype, tol):
    w = torch.randn(48, 64)
    q, scale = quantize_int8(w)
    x = torch.randn(3, 64)
    want = x @ (q.float() * scale.to(dtype).float()[:, None]).t()
    got = Int8Weight(q, scale, dtype, CPU)(x.to(dtype)).float()
    assert torch.allclose(got, want, rtol=tol, atol=tol * want.abs().max().item())


def test_bad_inputs_are_refused():
    q, scale = quantize_int8(torch.randn(8, 16))
    with pytest.raises(ValueError, match="float32, bfloat16 or float16"):
        Int8Weight(q, scale, torch.float64, CPU)
    with pytest.raises(ValueError, match="q int8"):
        Int8Weight(q.float(), scale, torch.float32, CPU)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="float32 activations, got torch.bfloat16"):
        Int8Weight(q, scale, torch.float32, CPU)(torch.randn(2, 16, dtype=torch.bfloat16))

"""fp8: refused off CUDA sm_89+ with one line, shape checks, and the emulated path's roundings (CPU)."""

from __future__ import annotations

import pytest
import torch

from engine.quant.fp8 import E4M3, Fp8Weight, fp8_device_refusal, fp8_shape_refusal, quantize_fp8

CPU = torch.device("cpu")


def test_refused_on_the_cpu_with_one_line():
    reason = fp8_device_refusal(CPU)
    assert reason is not None and "\n" not in reason
    assert "compute capability 8.9" in reason and "cpu" in reason
    with pytest.raises(ValueError, match="8.9"):
        Fp8Weight(torch.randn(16, 16), CPU)


def test_shapes_that_are_not_multiples_of_16_are_named():
    assert fp8_shape_refusal(32, 64) is None
    assert "[24, 64]" in fp8_shape_refusal(24, 64)
    assert "[32, 40]" in fp8_shape_refusal(32, 40)


def test_quantize_fp8_rows_use_the_e4m3_range():
    t = torch.randn(8, 64) * torch.logspace(-3, 3, 8)[:, None]
    q, scale = quantize_fp8(t)
    assert q.dtype == E4M3
    assert torch.allclose(q.float().abs().amax(-1), torch.full((8,), 448.0))
    # e4m3 keeps 3 mantissa bits: a relative error of at most 2^-4 for normal values.
    assert ((q.float() * scale[:, None] - t).abs() <= t.abs() * 2**-4 + scale[:, None] * 2**-9).all()


def test_emulated_forward_is_close_to_float32():
    w, x = torch.randn(32, 64), torch.randn(4, 64)
    got = Fp8Weight(w, CPU, emulate=True)(x)
    want = x @ w.t()
    assert (got - want).norm() / want.norm() < 0.05


@pytest.mark.cuda
@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9), reason="needs CUDA sm_89+"
)
def test_scaled_mm_matches_the_emulation():
    dev = torch.device("cuda")
    w, x = torch.randn(64, 128), torch.randn(5, 128)
    emulated = Fp8Weight(w, CPU, emulate=True)(x)
    real = Fp8Weight(w, dev)(x.to(dev, torch.bfloat16)).float().cpu()
    assert torch.allclose(real, emulated, rtol=2e-2, atol=2e-2 * emulated.abs().max().item())

"""int4 kernel: the op's dequantization convention, our quantizer, dtype and shape checks (CPU)."""

from __future__ import annotations

import pytest
import torch

from engine.quant.int4 import Int4Weight, dequantize_int4, int4_unfit_reason, quantize_int4

CPU = torch.device("cpu")


def _codes(n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (n, k), generator=g, dtype=torch.int32)
    return codes, torch.rand(n, k // 32, generator=g) + 0.1, torch.randn(n, k // 32, generator=g)


def test_op_reads_codes_as_q_minus_8_times_scale_plus_zero():
    # Multiplying by the identity reads the weight back out of the packed op: each output is one product
    # with 1.0 plus zeros, so exact in float32.
    codes, scale, zero = _codes(32, 64)
    layer = Int4Weight(codes, scale, zero, torch.float32, CPU)
    read = layer(torch.eye(64)).t()  # [N, K]
    assert torch.equal(read, dequantize_int4(codes, scale, zero))
    s, z = scale.repeat_interleave(32, 1), zero.repeat_interleave(32, 1)
    assert torch.allclose(read, (codes.float() - 8) * s + z, rtol=0, atol=1e-6)
    assert not torch.allclose(read, codes.float() * s + z, atol=1e-2)  # not q * scale + zero


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2), (torch.float16, 3e-3)])
def test_forward_matches_the_dequantized_weight(dtype, tol):
    codes, scale, zero = _codes(48, 96, seed=1)
    x = torch.randn(5, 96)
    want = x @ dequantize_int4(codes, scale.to(dtype).float(), zero.to(dtype).float()).t()
    got = Int4Weight(codes, scale, zero, dtype, CPU)(x.to(dtype)).float()
    assert torch.allclose(got, want, rtol=tol, atol=tol * want.abs().max().item())


def test_quantize_int4_roundtrip_is_within_half_a_step():
    w = torch.randn(64, 128)
    codes, scale, zero = quantize_int4(w)
    assert codes.min() >= 0 and codes.max() <= 15
    err = (dequantize_int4(codes, scale, zero) - w).abs()
    step = scale.repeat_interleave(32, 1)
    assert (err <= step / 2 + 1e-6).all()
    # Each group's min and max are on the grid (lo + 0 * s and lo + 15 * s).
    g = w.reshape(64, 4, 32)
    d = dequantize_int4(codes, scale, zero).reshape(64, 4, 32)
    assert torch.allclose(d.amin(-1), g.amin(-1), atol=1e-5) and torch.allclose(
        d.amax(-1), g.amax(-1), atol=1e-5
    )


def test_constant_group_does_not_divide_by_zero():
    codes, scale, zero = quantize_int4(torch.full((16, 32), 0.25))
    assert torch.allclose(dequantize_int4(codes, scale, zero), torch.full((16, 32), 0.25))


def test_shapes_and_dtypes_the_cpu_op_cannot_take_are_named():
    assert int4_unfit_reason(16, 64, 32, CPU, torch.float32) is None
    assert "multiple of the group size" in int4_unfit_reason(16, 48, 32, CPU, torch.float32)
    assert "multiple of 16" in int4_unfit_reason(24, 64, 32, CPU, torch.float32)
    assert "activations" in int4_unfit_reason(16, 64, 32, CPU, torch.float64)
    assert "bfloat16" in int4_unfit_reason(16, 64, 32, torch.device("cuda"), torch.float16)
    with pytest.raises(ValueError, match="int4: out_features 24"):
        Int4Weight(*_codes(24, 64), torch.float32, CPU)


def test_wrong_activation_dtype_is_refused():
    layer = Int4Weight(*_codes(16, 64), torch.bfloat16, CPU)
    with pytest.raises(TypeError, match="bfloat16 activations, got torch.float32"):
        layer(torch.randn(2, 64))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_int4_matches_the_dequantized_weight():
    codes, scale, zero = _codes(64, 256, seed=2)
    dev = torch.device("cuda")
    x = torch.randn(7, 256)
    want = x @ dequantize_int4(codes, scale.bfloat16().float(), zero.bfloat16().float()).t()
    got = Int4Weight(codes, scale, zero, torch.bfloat16, dev)(x.to(dev, torch.bfloat16)).float().cpu()
    assert torch.allclose(got, want, rtol=3e-2, atol=3e-2 * want.abs().max().item())

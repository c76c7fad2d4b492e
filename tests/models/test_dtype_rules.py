"""dtype="auto": the checkpoint's half dtype on CUDA, bf16 (else fp16) for float32 or unnamed checkpoints,
float32 on the CPU; explicit dtypes as given. The GPU's bf16 support is a stand-in."""

from __future__ import annotations

import pytest
import torch

from engine.dtype_rules import resolve_dtype

CUDA = torch.device("cuda", 1)
CPU = torch.device("cpu")


def never_asked(device: torch.device) -> bool:
    raise AssertionError("bf16 support asked for although the checkpoint's dtype decides")


@pytest.mark.parametrize("checkpoint", [torch.float16, torch.bfloat16])
def test_cuda_keeps_a_half_checkpoint(checkpoint):
    assert resolve_dtype("auto", checkpoint, CUDA, never_asked) is checkpoint


@pytest.mark.parametrize("checkpoint", [torch.float32, None])
@pytest.mark.parametrize(("bf16", "expected"), [(True, torch.bfloat16), (False, torch.float16)])
def test_cuda_casts_float32_or_unnamed_to_bf16_where_supported(checkpoint, bf16, expected):
    asked: list[torch.device] = []

    def supports(device: torch.device) -> bool:
        asked.append(device)
        return bf16

    assert resolve_dtype("auto", checkpoint, CUDA, supports) is expected
    assert asked == [CUDA]


@pytest.mark.parametrize("checkpoint", [torch.float16, torch.bfloat16, torch.float32, None])
def test_cpu_is_float32(checkpoint):
    assert resolve_dtype("auto", checkpoint, CPU, never_asked) is torch.float32


@pytest.mark.parametrize("device", [CPU, CUDA])
def test_explicit_dtypes_are_taken_as_given(device):
    assert resolve_dtype("float32", torch.bfloat16, device, never_asked) is torch.float32
    assert resolve_dtype("float16", None, device, never_asked) is torch.float16
    assert resolve_dtype(torch.bfloat16, torch.float32, device, never_asked) is torch.bfloat16
    with pytest.raises(ValueError, match="dtype must be auto"):
        resolve_dtype("int8", None, device, never_asked)

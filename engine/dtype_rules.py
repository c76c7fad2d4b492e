"""dtype="auto": which dtype the weights and the KV cache get. The one place these rules live.

    CPU:   float32 whatever the checkpoint (bf16/fp16 matmuls there are slow or inexact).
    CUDA:  the checkpoint's float16 / bfloat16 as it is;
           float32 or no `torch_dtype` in its config -> bfloat16 where the GPU supports it (sm_80+: it has
           float32's range, so a bf16-trained model cannot overflow), else float16; logged, because the
           weights are then cast. float32 weights would run without tensor cores (about 10x slower).
An explicit dtype ("float32", "float16", "bfloat16") is always taken as given.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog
import torch

log = structlog.get_logger("conveyor.engine")

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _cuda_bf16(device: torch.device) -> bool:
    with torch.cuda.device(device):
        return bool(torch.cuda.is_bf16_supported())


def resolve_dtype(
    dtype: str | torch.dtype,
    checkpoint_dtype: torch.dtype | None,
    device: torch.device,
    bf16_supported: Callable[[torch.device], bool] = _cuda_bf16,
) -> torch.dtype:
    """The dtype to load in. bf16_supported: asked only on CUDA for a float32 or unnamed checkpoint."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype != "auto":
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be auto, {', '.join(DTYPES)}; got {dtype!r}")
        return DTYPES[dtype]
    if device.type != "cuda":
        return torch.float32
    if checkpoint_dtype in (torch.float16, torch.bfloat16):
        return checkpoint_dtype
    chosen = torch.bfloat16 if bf16_supported(device) else torch.float16
    log.info(
        "dtype auto: casting the checkpoint for tensor cores",
        checkpoint_dtype=str(checkpoint_dtype) if checkpoint_dtype is not None else "not given",
        dtype=str(chosen),
        device=str(device),
    )
    return chosen

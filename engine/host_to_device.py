"""Host data onto the device without waiting for the device.

A host-to-device copy from pageable memory first waits for all work queued on the stream (CUDA stages it
synchronously), which would make the host wait for the forward it has just queued. Through pinned memory
and a non-blocking copy the host goes on at once; on the CPU this is a plain conversion.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def to_device(
    x: torch.Tensor | np.ndarray | Sequence[int] | Sequence[float],
    device: torch.device,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    t = torch.as_tensor(x, dtype=dtype)
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)

"""Row-wise argmax that is fast on the CPU too.

torch's CPU argmax over [256, 32000] float32 took ~27 ms on this 2-core EPYC, numpy's ~4 ms (it is one
vectorised pass); both return the first maximal index, NaN counting as the maximum. On other devices torch's.
"""

from __future__ import annotations

import torch


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """x: [R, V] -> [R] int64 on x's device."""
    if x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() == 2 and x.shape[1] > 0:
        # numpy reads a column-sliced (vocab-padded) view in place: no copy of the [R, V] logits.
        return torch.from_numpy(x.numpy().argmax(axis=-1).astype("int64"))
    return x.argmax(dim=-1)

"""Row-wise argmax that is fast on the CPU too.

torch's CPU argmax over a [256, 32000] float32 batch is several times slower than numpy's, which is one
vectorised pass; both return the first maximal index, NaN counting as the maximum. Host tensors only: the
device path (`engine.sampling.device_sampler`) is chosen when the sampler is built.
"""

from __future__ import annotations

import torch


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """x: [R, V] on the CPU -> [R] int64."""
    if x.dtype == torch.float32 and x.dim() == 2 and x.shape[1] > 0:
        # numpy reads a column-sliced (vocab-padded) view in place: no copy of the [R, V] logits.
        return torch.from_numpy(x.numpy().argmax(axis=-1).astype("int64"))
    return x.argmax(dim=-1)

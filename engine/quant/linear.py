"""QuantLinear: a column- or row-parallel linear layer whose matmul is a quantized kernel.

    column-parallel  y = kernel(x) + b
    row-parallel     y = all_reduce(kernel(x_r)) + b      (tp > 1: each rank's kernel holds its shard)

`kernel` is one of Int8Weight, Int4Weight, Fp8Weight: a module mapping [M, K] -> [M, N].
"""

from __future__ import annotations

import torch
from torch import nn

from engine.distributed.group import TPGroup


class QuantLinear(nn.Module):
    def __init__(
        self, kernel: nn.Module, bias: torch.Tensor | None, reduce: TPGroup | None, kind: str
    ) -> None:
        super().__init__()
        self.kernel = kernel
        self.kind = kind  # "int8", "int4 g32", "fp8", "fp8-emulated": for the load log and repr
        self.in_features = int(getattr(kernel, "in_features"))  # noqa: B009 (every kernel has them)
        self.out_features = int(getattr(kernel, "out_features"))  # noqa: B009
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)
        self.reduce = reduce if reduce is not None and reduce.size > 1 else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., K] -> [..., N]
        lead = x.shape[:-1]
        y = self.kernel(x.reshape(-1, x.shape[-1])).reshape(*lead, self.out_features)
        if self.reduce is not None:
            y = self.reduce.all_reduce(y)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return self.kind

"""Sharded stand-ins for a transformers model's own nn.Linear / nn.Embedding modules (Megatron-style).

Each holds only this rank's slice of its weight, and says in `tp_slices` which slice of the checkpoint tensor
that is, so the loader reads exactly that from the safetensors file:

    ColumnParallelLinear  weight [out/N, in]   output columns of q/k/v, gate/up; no communication
    RowParallelLinear     weight [out, in/N]   input rows of o_proj/down_proj; one all-reduce, bias added after
    VocabParallelEmbedding weight [Vp/N, H]    rows of the padded vocabulary; ids outside give 0; all-reduce
    VocabParallelHead     weight [Vp/N, H]     this rank's logits columns [.., Vp/N]; gathered by the caller

Parameters are created on the meta device; the loader gives them their storage. (These duplicate the native
model's layers in engine/distributed/layers.py by design for now; only the slicing rules are shared, from
engine/distributed/partition.py.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.distributed.group import TPGroup
from engine.distributed.partition import Span


@dataclass(frozen=True)
class Slice:
    """The part of a checkpoint tensor a rank holds: `span` along `dim`. Rows past the checkpoint's end (the
    padded vocabulary) are zeros."""

    dim: int
    span: Span


def _meta_param(*shape: int, dtype: torch.dtype) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype, device="meta"), requires_grad=False)


class ColumnParallelLinear(nn.Module):
    def __init__(self, linear: nn.Linear, span: Span) -> None:
        super().__init__()
        dtype = linear.weight.dtype
        self.weight = _meta_param(span.length, linear.in_features, dtype=dtype)  # [out/N, in]
        self.bias = _meta_param(span.length, dtype=dtype) if linear.bias is not None else None
        self.tp_slices = {"weight": Slice(0, span), "bias": Slice(0, span)}

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out/N]
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    def __init__(self, linear: nn.Linear, span: Span, group: TPGroup) -> None:
        super().__init__()
        dtype = linear.weight.dtype
        self.group = group
        self.weight = _meta_param(linear.out_features, span.length, dtype=dtype)  # [out, in/N]
        # Whole on every rank, added once after the sum.
        self.bias = _meta_param(linear.out_features, dtype=dtype) if linear.bias is not None else None
        self.tp_slices = {"weight": Slice(1, span)}

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in/N] -> [..., out], the sum over ranks
        out = self.group.all_reduce(F.linear(x, self.weight))
        return out if self.bias is None else out + self.bias


class VocabParallelEmbedding(nn.Module):
    """Rows `span` of the padded vocabulary. transformers' scaled word embeddings (Gemma 3) multiply the rows
    by their `embed_scale` buffer (a 0-d tensor, already filled when the module is replaced): kept here."""

    def __init__(self, embedding: nn.Embedding, span: Span, group: TPGroup) -> None:
        super().__init__()
        self.group = group
        self.span = span
        self.weight = _meta_param(span.length, embedding.embedding_dim, dtype=embedding.weight.dtype)
        scale = getattr(embedding, "embed_scale", None)
        self.embed_scale: torch.Tensor | None
        self.register_buffer(
            "embed_scale", scale if isinstance(scale, torch.Tensor) else None, persistent=False
        )
        self.tp_slices = {"weight": Slice(0, span)}

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # [...] int64 -> [..., H]
        mine = (ids >= self.span.start) & (ids < self.span.stop)
        local = torch.where(mine, ids - self.span.start, 0)
        rows = F.embedding(local, self.weight) * mine[..., None].to(self.weight.dtype)
        rows = self.group.all_reduce(rows)
        if self.embed_scale is not None:
            rows = rows * self.embed_scale.to(rows.dtype)  # as the model's own module rounds it
        return rows


class VocabParallelHead(nn.Module):
    """The output projection's rows `span` of the padded vocabulary: this rank's logits columns, not gathered
    (the model wrapper gathers them onto rank 0 after the model's own logit multipliers)."""

    def __init__(self, head: nn.Linear, span: Span, weight: nn.Parameter | None = None) -> None:
        super().__init__()
        dtype = head.weight.dtype
        self.vocab_size = head.out_features  # the real vocabulary, before padding
        # Tied heads share the embedding's (identically sliced) parameter.
        self.weight = (
            weight if weight is not None else _meta_param(span.length, head.in_features, dtype=dtype)
        )
        self.bias = _meta_param(span.length, dtype=dtype) if head.bias is not None else None
        self.tp_slices = {"weight": Slice(0, span), "bias": Slice(0, span)}

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # [..., H] -> [..., Vp/N]
        return F.linear(hidden, self.weight, self.bias)

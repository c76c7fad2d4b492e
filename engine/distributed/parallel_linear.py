"""Megatron-style column- and row-parallel linear layers, for the native and the generic model paths.

    column-parallel  y[:, cols_r] = x @ W[cols_r].T + b[cols_r]     output columns split, no communication
    row-parallel     y = all_reduce(x[:, rows_r] @ W[:, rows_r].T) + b     one all_reduce, bias once

A column-parallel layer is attention's q/k/v followed by a row-parallel o_proj (heads split, the reduce
after o_proj), and the MLP's gate/up followed by a row-parallel down_proj. Which slice a rank holds comes
from engine/distributed/partition.py only. Each parameter's `weight_loader` (weight_loader.py) reads that
slice of its checkpoint tensor and nothing more. Parameters are created with `torch.empty` on the current
default device (build under `torch.device("meta")` to allocate nothing; `materialize` gives them storage).

With one rank every layer computes exactly what nn.Linear computes (same calls, same bits).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from engine.distributed.group import TPGroup
from engine.distributed.partition import Span, even_span, kv_head_span
from engine.distributed.weight_loader import (
    SliceSource,
    check_shape,
    copy_part,
    default_weight_loader,
    set_weight_loader,
)


class Segment(NamedTuple):
    """One checkpoint tensor stacked into a column-parallel weight: rows `rows` of a `full_rows`-row tensor."""

    shard: str | None  # the checkpoint part it comes from (q/k/v, gate/up), None for an unfused weight
    full_rows: int
    rows: Span  # the rows this rank reads, stacked after the previous segments' rows


def _param(*shape: int, dtype: torch.dtype | None) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)


class ColumnParallelLinear(nn.Module):
    """y = x @ W_r.T + b_r where W_r stacks this rank's rows of each segment (output columns of y).

    weight: [sum of segment rows.length, in_features]; bias: [same] or None. No communication."""

    def __init__(
        self,
        in_features: int,
        segments: list[Segment],
        bias: bool,
        tp: TPGroup,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.tp = tp
        self.in_features = in_features
        self.segments = {s.shard: s for s in segments}
        self.offsets: dict[str | None, int] = {}
        out = 0
        for s in segments:
            self.offsets[s.shard] = out
            out += s.rows.length
        self.out_features = out
        self.weight = _param(out, in_features, dtype=dtype)
        self.bias = _param(out, dtype=dtype) if bias else None
        set_weight_loader(self.weight, self.weight_loader)
        set_weight_loader(self.bias, self.weight_loader)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., in] -> [..., out_local]
        return F.linear(x, self.weight, self.bias)

    def weight_loader(self, param: torch.Tensor, source: SliceSource, shard: str | None) -> None:
        """Rows `rows` of the segment's checkpoint tensor (weight [full_rows, in] or bias [full_rows])."""
        if shard not in self.segments:
            raise ValueError(f"no part {shard!r} in this layer (parts: {sorted(map(str, self.segments))})")
        seg = self.segments[shard]
        check_shape(source, (seg.full_rows, *param.shape[1:]))
        target = param.data.narrow(0, self.offsets[shard], seg.rows.length)
        copy_part(target, source[seg.rows.start : seg.rows.stop])


def column_linear(
    in_features: int,
    out_features: int,
    bias: bool,
    tp: TPGroup,
    dtype: torch.dtype | None = None,
    rows: Span | None = None,
) -> ColumnParallelLinear:
    """An unfused column-parallel layer: this rank's `rows` (default: an even split) of the output features."""
    span = rows if rows is not None else even_span(out_features, tp.rank, tp.size, "output features")
    return ColumnParallelLinear(in_features, [Segment(None, out_features, span)], bias, tp, dtype)


def kv_rows(num_kv_heads: int, head_dim: int, tp: TPGroup) -> Span:
    """This rank's rows of a k or v projection: its KV heads (replicated when fewer heads than ranks)."""
    heads = kv_head_span(num_kv_heads, tp.rank, tp.size)
    return Span(heads.start * head_dim, heads.length * head_dim)


def qkv_linear(
    hidden: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool, tp: TPGroup
) -> ColumnParallelLinear:
    """Fused q/k/v: this rank's query heads (split evenly) then its KV heads (kv_head_span: replicated
    when num_kv_heads < size). Output per token: [q heads_r * D | kv heads_r * D | kv heads_r * D]."""
    q = even_span(num_heads, tp.rank, tp.size, "num_attention_heads")
    kv = kv_rows(num_kv_heads, head_dim, tp)
    segments = [
        Segment("q", num_heads * head_dim, Span(q.start * head_dim, q.length * head_dim)),
        Segment("k", num_kv_heads * head_dim, kv),
        Segment("v", num_kv_heads * head_dim, kv),
    ]
    return ColumnParallelLinear(hidden, segments, bias, tp)


def gate_up_linear(hidden: int, intermediate: int, tp: TPGroup) -> ColumnParallelLinear:
    """Fused gate/up: this rank's intermediate columns of each, [gate_r | up_r]."""
    span = even_span(intermediate, tp.rank, tp.size, "intermediate_size")
    return ColumnParallelLinear(
        hidden, [Segment("gate", intermediate, span), Segment("up", intermediate, span)], False, tp
    )


class RowParallelLinear(nn.Module):
    """y = all_reduce(x_r @ W[:, in_r].T) + b. x_r: this rank's input columns (a column-parallel output).

    weight: [out_features, in_features / size]; bias: [out_features] (whole, added once after the reduce)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool,
        tp: TPGroup,
        dtype: torch.dtype | None = None,
        what: str = "input features",
    ) -> None:
        super().__init__()
        self.tp = tp
        self.in_features, self.out_features = in_features, out_features
        self.span = even_span(in_features, tp.rank, tp.size, what)
        self.weight = _param(out_features, self.span.length, dtype=dtype)
        self.bias = _param(out_features, dtype=dtype) if bias else None
        set_weight_loader(self.weight, self.weight_loader)
        set_weight_loader(self.bias, default_weight_loader)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., in_local] -> [..., out]
        if self.tp.size == 1:
            return F.linear(x, self.weight, self.bias)
        y = self.tp.all_reduce(F.linear(x, self.weight))
        return y if self.bias is None else y + self.bias

    def weight_loader(self, param: torch.Tensor, source: SliceSource, shard: str | None) -> None:
        """Columns in_r of the [out_features, in_features] checkpoint weight."""
        if shard is not None:
            raise ValueError(f"a row-parallel layer has no part {shard!r}")
        check_shape(source, (self.out_features, self.in_features))
        copy_part(param.data, source[:, self.span.start : self.span.stop])

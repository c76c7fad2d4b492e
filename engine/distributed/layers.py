"""Megatron-style tensor-parallel layers: each rank holds one slice of a weight and reads only that slice.

    column-parallel  y[:, cols_r] = x @ W[cols_r].T       output columns split, no communication
    row-parallel     y = all_reduce(x[:, rows_r] @ W[:, rows_r].T) + b     one all_reduce, bias once
    vocab embedding  rank r holds rows vocab_span(r); ids outside are zero; one all_reduce
    vocab LM head    local logits [R, padded_vocab / size] -> gather_columns -> rank 0 [R, vocab]

A column-parallel layer is attention's q/k/v followed by a row-parallel o_proj (heads split, the reduce
after o_proj), and the MLP's gate/up followed by a row-parallel down_proj. Which slice a rank holds comes
from engine/distributed/partition.py only.

Weight loading: `module.load_slice(name, source, shard)` copies the rank's part of one checkpoint tensor into
parameter `name` ("weight" / "bias"). `source` is a safetensors slice (`safe_open(...).get_slice(key)`) or a
torch.Tensor (tests); only `source[a:b]` (rows) or `source[:, a:b]` (columns) is read, never the whole
tensor. `shard` names the part of a fused parameter the checkpoint tensor fills (q/k/v, gate/up), else None.

With one rank every layer computes exactly what nn.Linear / nn.Embedding compute (same calls, same bits).
"""

from __future__ import annotations

from typing import NamedTuple, Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import nn

from engine.distributed.group import TPGroup
from engine.distributed.partition import Span, even_span, kv_head_span, vocab_span


class SliceSource(Protocol):
    """A checkpoint tensor read lazily: safetensors' PySafeSlice, or a torch.Tensor."""

    def __getitem__(self, index: object) -> torch.Tensor: ...


@runtime_checkable
class LoadsSlices(Protocol):
    """A module whose parameters are slices of checkpoint tensors, which it reads itself."""

    def load_slice(self, name: str, source: SliceSource, shard: str | None) -> None: ...


def source_shape(source: SliceSource) -> tuple[int, ...]:
    if isinstance(source, torch.Tensor):
        return tuple(source.shape)
    return tuple(source.get_shape())  # type: ignore[attr-defined]


def _check_shape(source: SliceSource, expected: tuple[int, ...]) -> None:
    got = source_shape(source)
    if got != expected:
        raise ValueError(f"checkpoint shape {got} != expected {expected}")


def _copy(target: torch.Tensor, part: torch.Tensor) -> None:
    if part.shape != target.shape:  # a source that lied about its shape
        raise ValueError(f"read a slice of shape {tuple(part.shape)}, expected {tuple(target.shape)}")
    target.copy_(part)


class Segment(NamedTuple):
    """One checkpoint tensor stacked into a column-parallel weight: rows `rows` of a `full_rows`-row tensor."""

    shard: str | None  # the checkpoint part it comes from (q/k/v, gate/up), None for an unfused weight
    full_rows: int
    rows: Span  # the rows this rank reads, stacked after the previous segments' rows


class ColumnParallelLinear(nn.Module):
    """y = x @ W_r.T + b_r where W_r stacks this rank's rows of each segment (output columns of y).

    weight: [sum of segment rows.length, in_features]; bias: [same] or None. No communication."""

    def __init__(self, in_features: int, segments: list[Segment], bias: bool, tp: TPGroup) -> None:
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
        self.weight = nn.Parameter(torch.empty(out, in_features))
        self.bias = nn.Parameter(torch.empty(out)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [T, in] -> [T, out_local]
        return F.linear(x, self.weight, self.bias)

    def load_slice(self, name: str, source: SliceSource, shard: str | None) -> None:
        if shard not in self.segments:
            raise ValueError(f"no part {shard!r} in this layer (parts: {sorted(map(str, self.segments))})")
        seg = self.segments[shard]
        param = self.weight if name == "weight" else self.bias
        if param is None:
            raise ValueError(f"the checkpoint has a {name} this layer does not")
        _check_shape(source, (seg.full_rows, self.in_features) if name == "weight" else (seg.full_rows,))
        target = param.data.narrow(0, self.offsets[shard], seg.rows.length)
        _copy(target, source[seg.rows.start : seg.rows.stop])


def column_linear(in_features: int, out_features: int, bias: bool, tp: TPGroup) -> ColumnParallelLinear:
    span = even_span(out_features, tp.rank, tp.size, "output features")
    return ColumnParallelLinear(in_features, [Segment(None, out_features, span)], bias, tp)


def qkv_linear(
    hidden: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool, tp: TPGroup
) -> ColumnParallelLinear:
    """Fused q/k/v: this rank's query heads (split evenly) then its KV heads (kv_head_span: replicated
    when num_kv_heads < size). Output per token: [q heads_r * D | kv heads_r * D | kv heads_r * D]."""
    q = even_span(num_heads, tp.rank, tp.size, "num_attention_heads")
    kv = kv_head_span(num_kv_heads, tp.rank, tp.size)

    def rows(span: Span) -> Span:
        return Span(span.start * head_dim, span.length * head_dim)

    segments = [
        Segment("q", num_heads * head_dim, rows(q)),
        Segment("k", num_kv_heads * head_dim, rows(kv)),
        Segment("v", num_kv_heads * head_dim, rows(kv)),
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

    def __init__(self, in_features: int, out_features: int, bias: bool, tp: TPGroup) -> None:
        super().__init__()
        self.tp = tp
        self.in_features, self.out_features = in_features, out_features
        self.span = even_span(in_features, tp.rank, tp.size, "input features")
        self.weight = nn.Parameter(torch.empty(out_features, self.span.length))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [T, in_local] -> [T, out]
        if self.tp.size == 1:
            return F.linear(x, self.weight, self.bias)
        y = self.tp.all_reduce(F.linear(x, self.weight))
        return y if self.bias is None else y + self.bias

    def load_slice(self, name: str, source: SliceSource, shard: str | None) -> None:
        if shard is not None:
            raise ValueError(f"a row-parallel layer has no part {shard!r}")
        if name == "weight":
            _check_shape(source, (self.out_features, self.in_features))
            _copy(self.weight.data, source[:, self.span.start : self.span.stop])
        elif self.bias is not None:
            _check_shape(source, (self.out_features,))
            _copy(self.bias.data, source[:])
        else:
            raise ValueError(f"the checkpoint has a {name} this layer does not")


class VocabParallelEmbedding(nn.Module):
    """Rank r holds rows vocab_span(vocab, r, size) of the (padded) table; rows past the real vocabulary
    are zero. weight: [padded_vocab / size, hidden]."""

    def __init__(self, vocab_size: int, hidden: int, tp: TPGroup) -> None:
        super().__init__()
        self.tp = tp
        self.vocab_size, self.hidden = vocab_size, hidden
        self.span = vocab_span(vocab_size, tp.rank, tp.size)
        self.weight = nn.Parameter(torch.empty(self.span.length, hidden))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # ids: [T] int64 -> [T, hidden]
        if self.tp.size == 1:
            return F.embedding(ids, self.weight)
        local = ids - self.span.start
        outside = (local < 0) | (local >= self.span.length)  # [T] bool: another rank's token
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        return self.tp.all_reduce(out.masked_fill_(outside[:, None], 0.0))

    def load_slice(self, name: str, source: SliceSource, shard: str | None) -> None:
        if name != "weight" or shard is not None:
            raise ValueError(f"a vocabulary-parallel table has only a weight, not {name}[{shard}]")
        _check_shape(source, (self.vocab_size, self.hidden))
        real = max(0, min(self.span.stop, self.vocab_size) - self.span.start)  # rows before the padding
        _copy(self.weight.data[:real], source[self.span.start : self.span.start + real])
        self.weight.data[real:].zero_()


class ParallelLMHead(VocabParallelEmbedding):
    """The LM head over the same row split as the embedding (so a tied head shares the embedding's shard).

    Logits are computed per rank on the local rows (`x @ weight.T`, [R, padded_vocab / size]; the model may
    compute that product itself, e.g. in slices on the CPU) and then `gather`ed onto rank 0."""

    def forward(self, x: torch.Tensor) -> torch.Tensor | None:  # x: [R, hidden]
        return self.gather(F.linear(x, self.weight))

    def gather(self, local: torch.Tensor) -> torch.Tensor | None:
        """[R, padded_vocab / size] on every rank -> [R, vocab] on rank 0, None elsewhere. A collective."""
        full = self.tp.gather_columns(local)
        if full is None or full.shape[-1] == self.vocab_size:
            return full
        return full[:, : self.vocab_size]

"""Vocabulary-parallel embedding and LM head, for the native and the generic model paths.

    vocab embedding  rank r holds rows vocab_span(r) of the padded [vocab, hidden] table; ids outside are
                     zero; one all_reduce
    vocab LM head    the same row split: local logits [R, padded_vocab / size], then `gather` onto rank 0
                     -> [R, vocab] (the padding columns dropped)

A tied head shares the embedding's parameter (same split, so the same shard). On the CPU the head's matmul
runs in slices of its rows (`sliced = True`, set by the loader from the device; `sliced_linear`). With one
rank both compute exactly what nn.Embedding / nn.Linear compute.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.distributed.group import TPGroup
from engine.distributed.partition import vocab_span
from engine.distributed.weight_loader import SliceSource, check_shape, copy_part, set_weight_loader

# Rows of the LM head weight per matmul on the CPU, and the fewest input rows for which slicing pays (each
# slice's [R, slice] output block stays in cache while the weight streams past it; below 8 input rows one
# matmul is as fast, or faster).
LM_HEAD_SLICE = 2048
LM_HEAD_SLICE_MIN_ROWS = 8


def sliced_linear(x: torch.Tensor, weight: torch.Tensor, slice_rows: int) -> torch.Tensor:
    """F.linear(x, weight) computed `slice_rows` output columns at a time into one preallocated output.

    x: [R, K], weight: [N, K] -> [R, N]. The split is over N, never over the reduction K, so each output
    is the same K-long dot product as in one matmul. Whether it is bit for bit the same depends on the BLAS
    kernel each slice's shape selects: below ~16 columns CPU BLAS always takes another path (so a tail
    shorter than half a slice joins the slice before it), and some widths do on some CPUs.
    tests/models/test_sliced_lm_head.py checks LM_HEAD_SLICE bit for bit and other widths to rounding."""
    n = weight.shape[0]
    out = torch.empty(x.shape[0], n, dtype=x.dtype, device=x.device)
    starts = list(range(0, n, slice_rows))
    if len(starts) > 1 and n - starts[-1] < slice_rows // 2:
        starts.pop()
    for start, end in zip(starts, starts[1:] + [n], strict=True):
        torch.mm(x, weight[start:end].t(), out=out[:, start:end])
    return out


class VocabRows(nn.Module):
    """Rank r holds rows vocab_span(vocab, r, size) of a (padded) [vocab, hidden] table; rows past the real
    vocabulary are zero. weight: [padded_vocab / size, hidden]. Shared by the embedding and the LM head."""

    def __init__(self, vocab_size: int, hidden: int, tp: TPGroup, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.tp = tp
        self.vocab_size, self.hidden = vocab_size, hidden
        self.span = vocab_span(vocab_size, tp.rank, tp.size)
        self.weight = nn.Parameter(torch.empty(self.span.length, hidden, dtype=dtype), requires_grad=False)
        set_weight_loader(self.weight, self.weight_loader)

    def weight_loader(self, param: torch.Tensor, source: SliceSource, shard: str | None) -> None:
        """This rank's rows of a [vocab, ...] checkpoint tensor (table or bias), zeros past its end."""
        if shard is not None:
            raise ValueError(f"a vocabulary-parallel parameter has no part {shard!r}")
        check_shape(source, (self.vocab_size, *param.shape[1:]))
        real = max(0, min(self.span.stop, self.vocab_size) - self.span.start)  # rows before the padding
        copy_part(param.data[:real], source[self.span.start : self.span.start + real])
        param.data[real:].zero_()


class VocabParallelEmbedding(VocabRows):
    """`scale` (a 0-d tensor, or None): transformers' scaled word embeddings (Gemma 3) multiply the rows by
    their `embed_scale`, after the sum over ranks, rounded as the model's own module does."""

    def __init__(
        self,
        vocab_size: int,
        hidden: int,
        tp: TPGroup,
        dtype: torch.dtype | None = None,
        scale: torch.Tensor | None = None,
    ) -> None:
        super().__init__(vocab_size, hidden, tp, dtype)
        self.embed_scale: torch.Tensor | None
        self.register_buffer("embed_scale", scale, persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # ids: [...] int64 -> [..., hidden]
        if self.tp.size == 1:
            rows = F.embedding(ids, self.weight)
        else:
            local = ids - self.span.start
            outside = (local < 0) | (local >= self.span.length)  # [...] bool: another rank's token
            rows = F.embedding(local.masked_fill(outside, 0), self.weight)
            rows = self.tp.all_reduce(rows.masked_fill_(outside[..., None], 0.0))
        if self.embed_scale is not None:
            rows = rows * self.embed_scale.to(rows.dtype)
        return rows


class ParallelLMHead(VocabRows):
    """The LM head over the embedding's row split. `forward` gives this rank's logits columns
    [..., padded_vocab / size] (a model may scale them before `gather`); bias: [padded_vocab / size] or None.
    `sliced`: compute 2-D inputs of at least LM_HEAD_SLICE_MIN_ROWS rows by `sliced_linear` (the CPU)."""

    def __init__(
        self, vocab_size: int, hidden: int, tp: TPGroup, bias: bool = False, dtype: torch.dtype | None = None
    ) -> None:
        super().__init__(vocab_size, hidden, tp, dtype)
        self.bias = (
            nn.Parameter(torch.empty(self.span.length, dtype=dtype), requires_grad=False) if bias else None
        )
        set_weight_loader(self.bias, self.weight_loader)
        self.sliced = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., hidden] -> [..., padded_vocab / size]
        if self.sliced and self.bias is None and x.dim() == 2 and x.shape[0] >= LM_HEAD_SLICE_MIN_ROWS:
            return sliced_linear(x, self.weight, LM_HEAD_SLICE)
        return F.linear(x, self.weight, self.bias)

    def gather(self, local: torch.Tensor) -> torch.Tensor | None:
        """[R, padded_vocab / size] on every rank -> [R, vocab] on rank 0, None elsewhere. A collective."""
        full = self.tp.gather_columns(local)
        if full is None or full.shape[-1] == self.vocab_size:
            return full
        return full[:, : self.vocab_size]

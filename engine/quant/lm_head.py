"""The LM head served from a GGUF file's own blocks on the int4 kernel, without a second rounding.

One decode step of a small model reads its LM head once per token: SmolLM2-135M's tied head is 49,152 x 576,
56 MB in bfloat16 against 66 MB for all 120 int4 projections, so left in the serving dtype it is a large part
of a lone request's step. The file holds it quantized (llama.cpp keeps a tied head as Q8_0 in a Q4_1 file):

    Q4_0 / Q4_1   int4 group 32 as the projections take them (gguf_blocks.q4_to_int4)
    Q8_0          an exact pair of int4 halves: q = 16 * hi + lo with hi in -8..7 and lo in 0..15, so

                      x . (d * q) = x . (16d * hi) + x . (d * lo)

                  one int4 matmul over K' = 2K of [x, x] against codes [hi + 8 | lo], groups of 32 with
                  (scale 16d, zero 0) then (scale d, zero 8d): in the op's w = (c - 8) * scale + zero these
                  are 16d * hi and d * lo exactly, the file's d * q split in two (the scales rounded to the
                  activation dtype, as for every int4 layer). Twice the int4 reads of K, still a quarter of
                  bfloat16's.

The embedding keeps its table in the serving dtype (a row lookup, no packed kernel). torch's CPU int4 op
dequantizes the weights again for every few input rows, so its cost grows with the rows while a dense
matmul's barely does: for SmolLM2's head on two cores the pair took 3.6 ms for 1 row against 7.4 ms in
bfloat16, but 11 against 10 at 8 rows and 45 against 12 at 32. A tied head therefore keeps the embedding's
table (no extra memory) and multiplies by it from DENSE_MIN_ROWS rows on: the int4 kernel serves lone and
small batches, the table large ones. An untied head has only the kernel. Tensor parallelism: rank r's head
holds rows vocab_span(r); rows past the vocabulary give 0.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.distributed.vocab_parallel import ParallelLMHead
from engine.quant.gguf_blocks import INT4_TYPES, q4_to_int4, q8_0_to_int8, qtype_name
from engine.quant.int4 import GROUP_SIZE, Int4Weight, int4_unfit_reason

HEAD_TYPES = (*INT4_TYPES, "Q8_0")
# Rows (sampled sequences) from which a tied head multiplies by the embedding's table instead (see above).
DENSE_MIN_ROWS = 8


def q8_0_as_int4_pair(q: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q8_0 (q int8 [N, K], block scales d float32 [N, K/32]) -> int4 (codes int32 [N, 2K], scale and zero
    float32 [N, 2K/32]) whose matmul with [x, x] is x @ (d * q).T (see the module docstring)."""
    qi = q.to(torch.int32)
    hi = torch.div(qi, 16, rounding_mode="floor")  # -8..7
    lo = qi - 16 * hi  # 0..15
    codes = torch.cat([hi + 8, lo], dim=1)
    scale = torch.cat([16 * d, d], dim=1)
    zero = torch.cat([torch.zeros_like(d), 8 * d], dim=1)
    return codes, scale, zero


class QuantLMHead(nn.Module):
    """The vocabulary-parallel LM head on an int4 kernel: forward [..., hidden] -> [..., padded_vocab / size]
    (this rank's columns), gather onto rank 0 as ParallelLMHead does. `doubled`: the kernel takes [x, x].
    `dense`: the original head when it is tied (its table is the embedding's), used from DENSE_MIN_ROWS rows."""

    def __init__(
        self, head: ParallelLMHead, kernel: Int4Weight, doubled: bool, kind: str, dense: bool
    ) -> None:
        super().__init__()
        self.kernel = kernel
        self.doubled = doubled
        self.kind = kind + (f", the table from {DENSE_MIN_ROWS} rows" if dense else "")
        self.tp, self.vocab_size, self.hidden = head.tp, head.vocab_size, head.hidden
        self.bias = head.bias
        self.dense = head if dense else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.hidden)
        if self.dense is not None and x2.shape[0] >= DENSE_MIN_ROWS:
            return self.dense(x)
        if self.doubled:
            x2 = torch.cat([x2, x2], dim=-1)  # [R, 2 * hidden]
        y = self.kernel(x2).reshape(*lead, self.kernel.out_features)
        return y if self.bias is None else y + self.bias

    def gather(self, local: torch.Tensor) -> torch.Tensor | None:
        full = self.tp.gather_columns(local)
        if full is None or full.shape[-1] == self.vocab_size:
            return full
        return full[:, : self.vocab_size]

    def extra_repr(self) -> str:
        return self.kind


def quant_lm_head(
    head: ParallelLMHead, qtype: object, data, shape: tuple[int, int], tied: bool = False
) -> QuantLMHead | str:
    """The head on the int4 kernel from the file's blocks of the whole [vocab, hidden] table, or why not (a
    string for the load log: the head then stays as loaded). `tied`: the head's table is the embedding's,
    kept for large batches."""
    name = qtype_name(qtype)
    weight = head.weight
    rows, hidden = weight.shape
    if name not in HEAD_TYPES:
        return f"as loaded ({name})"
    if shape != (head.vocab_size, hidden):
        raise ValueError(f"lm_head: file shape {shape} != ({head.vocab_size}, {hidden})")
    span = head.span
    real = max(0, min(span.stop, head.vocab_size) - span.start)  # this rank's rows before the padding
    mine = data[span.start : span.start + real]
    if name in INT4_TYPES:
        codes, scale, zero = q4_to_int4(qtype, mine, (real, hidden))
        doubled, kind = False, f"int4 g{GROUP_SIZE} ({name} blocks)"
    else:
        codes, scale, zero = q8_0_as_int4_pair(*q8_0_to_int8(mine, (real, hidden)))
        doubled, kind = True, f"int4 g{GROUP_SIZE} pair (Q8_0 blocks, exact)"
    if real < rows:  # padding rows: code 8 with scale 0 and zero 0 is the weight 0
        pad = rows - real
        codes = torch.cat([codes, torch.full((pad, codes.shape[1]), 8, dtype=codes.dtype)])
        scale = torch.cat([scale, scale.new_zeros(pad, scale.shape[1])])
        zero = torch.cat([zero, zero.new_zeros(pad, zero.shape[1])])
    unfit = int4_unfit_reason(rows, codes.shape[1], GROUP_SIZE, weight.device, weight.dtype)
    if unfit is not None:
        return f"as loaded ({name}): {unfit}"
    kernel = Int4Weight(codes, scale, zero, weight.dtype, weight.device)
    return QuantLMHead(head, kernel, doubled, kind, dense=tied)

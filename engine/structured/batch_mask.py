"""One token bitmask per step for the whole batch, applied to the logits before sampling.

    logits [B, V_head] float32     bitmask [B, ceil(V_head / 32)] int32, bit j of row i: token j allowed
    row i constrained  -> filled by its matcher, disallowed logits set to -inf (xgrammar's CPU/GPU kernel)
    row i free         -> not filled, not touched (`indices` names the constrained rows only)

The mask is as wide as the LM head (`vocab_size`), which can be wider than the tokenizer: xgrammar never
allows ids it has no token for, and columns past `vocab_size` (padding) are set to -inf here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from engine.batch_view import RowView
from engine.host_to_device import to_device
from engine.sampling.interface import SampledIds, SamplerResult, TokenSampler
from engine.sampling.request_rows import SamplingRequest

# (row in the batch, its xgrammar.GrammarMatcher)
MaskRows = list[tuple[int, Any]]


def apply_grammar_masks(logits: torch.Tensor, rows: MaskRows, vocab_size: int) -> torch.Tensor:
    """Mask `logits` [B, >= vocab_size] in place for the constrained `rows`; returns it."""
    if not rows:
        return logits
    import xgrammar as xgr

    bitmask = xgr.allocate_token_bitmask(logits.shape[0], vocab_size)  # all bits set: everything allowed
    for i, matcher in rows:
        matcher.fill_next_token_bitmask(bitmask, i)
    indices = [i for i, _ in rows]
    # From pinned memory: a non-blocking copy out of pageable memory would still wait for the queued forward.
    bitmask = to_device(bitmask, logits.device)
    xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=vocab_size, indices=indices)
    if logits.shape[1] > vocab_size:
        logits[indices, vocab_size:] = float("-inf")
    return logits


class GrammarMaskingSampler:
    """Wraps the engine's sampler: masks first, then samples.

    `rows_for(request_ids)` names the constrained rows of this batch; the wrapped sampler is untouched, so
    a batch without constraints costs one dict lookup per row.
    """

    def __init__(
        self, sampler: TokenSampler, rows_for: Callable[[list[str]], MaskRows], vocab_size: int
    ) -> None:
        self.sampler, self.rows_for, self.vocab_size = sampler, rows_for, vocab_size

    def launch(self, logits: torch.Tensor, view: RowView) -> SampledIds:
        logits = apply_grammar_masks(logits, self.rows_for(view.request_ids), self.vocab_size)
        return self.sampler.launch(logits, view)

    def __call__(self, logits: torch.Tensor, requests: list[SamplingRequest]) -> SamplerResult:
        logits = apply_grammar_masks(logits, self.rows_for([r.request_id for r in requests]), self.vocab_size)
        return self.sampler(logits, requests)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sampler, name)

"""Top-k of repetition-penalised logits without editing every seen token: penalise the raw candidates only.

The repetition penalty r rescales a row's seen tokens: x -> x / r if x > 0, else x * r. With r >= 1 no value
goes up. `topk_candidates(x, k')` gives, per row, a few hundred candidates holding the raw top-k' and a
bound m: every value outside them is <= m. Penalise only the candidates and let L be the k-th largest of
them: an outside token's penalised value is <= its raw value <= m, so if L >= m none can enter, and the
penalised top-k of the row is the top-k of the candidates (ties at the k-th value aside, where either
choice is a valid top-k, as with `torch.topk`). That holds whenever k of the top-k' are unseen, and often
when fewer are: penalised seen tokens still rank high.

    topk_candidates(k') --> seen? (RowView.seen_contains, a bit test) --> penalise --> L >= m ? top-k
    rows where L < m, and rows with r < 1 (seen tokens raised: they can climb from anywhere): exactly,
    every seen token penalised in a copy of the row, then `topk_rows`

k' - k adapts between steps (`extra`, read back after the call): raised after a step where a row missed,
x 15/16 after one where none did. This replaces gathering, scaling, scattering and restoring every seen
token of every row (~230k entries for 256 rows of 1k-token contexts, memory-bound) with a bit test of [R, 8k'].
"""

from __future__ import annotations

import numpy as np
import torch

from engine.batch_view import RowView
from engine.sampling.topk import top_sorted, topk_candidates, topk_rows

GROW_EXTRA = 16  # k' - k after the first step where a row missed


class SeenPenalty:
    """The repetition penalty of rows that take their top-k as candidates.

    seen_rows: [R] int64, each row's position in the step's `RowView` (any value where factor is 1);
    factor: [R] float32, the repetition penalty (1: none); extra: k' - k, updated by `topk` for the next step."""

    def __init__(self, seen: RowView, seen_rows: np.ndarray, factor: np.ndarray, extra: int) -> None:
        self.seen, self.seen_rows, self.factor = seen, seen_rows, factor
        self.extra = extra

    def subset(self, rows: np.ndarray) -> SeenPenalty:
        return SeenPenalty(self.seen, self.seen_rows[rows], self.factor[rows], self.extra)

    def topk(self, x: torch.Tensor, rows: np.ndarray, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [G, V] float32, raw logits of rows `rows` [G] (indices into R) -> the top-k of the penalised
        rows: (values [G, k] float32 sorted descending, ids [G, k] int64), as `topk_rows` of penalised x."""
        factor = self.factor[rows]  # [G]
        if bool((factor == 1.0).all()):
            return topk_rows(x, k)
        # The block search stays cheap up to k' = V / 256 (see topk.py): k' stops there unless k is past it.
        limit = x.shape[1] // 256 if k <= x.shape[1] // 256 else x.shape[1]
        wide = min(k + self.extra, limit)
        values, ids, bound = topk_candidates(x, wide)  # [G, W] raw, unordered; [G]
        f = factor[:, None]  # [G, 1]
        seen = self.seen.seen_contains(self.seen_rows[rows], ids) & (f != 1.0)  # [G, W]
        penalised = np.where(seen, np.where(values > 0, values / f, values * f), values)
        top_values, top_ids = top_sorted(penalised, ids, k)  # [G, k]
        fits = (top_values[:, -1].numpy() >= bound) & (factor >= 1.0)  # L >= m
        missed = np.flatnonzero(~fits)
        grown = max(GROW_EXTRA, (wide - k) * 3 // 2)
        self.extra = grown if len(missed) else (wide - k) * 15 // 16
        if len(missed):
            exact_values, exact_ids = topk_rows(self._penalised_copy(x, rows, missed), k)  # [M, k] each
            top_values[missed], top_ids[missed] = exact_values, exact_ids
        return top_values, top_ids

    def _penalised_copy(self, x: torch.Tensor, rows: np.ndarray, which: np.ndarray) -> torch.Tensor:
        """[len(which), V] float32: rows `which` of x (positions in x) with every seen token penalised."""
        out = x[torch.from_numpy(which)].numpy()  # a copy: x stays untouched
        for j, pos in enumerate(which.tolist()):
            ids = self.seen.seen_ids(int(self.seen_rows[rows[pos]]))
            f = self.factor[rows[pos]]
            v = out[j, ids]
            out[j, ids] = np.where(v > 0, v / f, v * f)
        return torch.from_numpy(out)

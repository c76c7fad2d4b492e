"""Top-k of repetition-penalised logits without editing every seen token: penalise the raw top-k' only.

The repetition penalty r rescales a row's seen tokens: x -> x / r if x > 0, else x * r. With r >= 1 no value
goes up. So take the raw top-k' (k' > k) and penalise only those k' values: if at least k of them are
unseen (unchanged), the penalised top-k of the row lies among them. Proof: let u be the k-th largest unseen
value among the k'; the k-th largest penalised value there is >= u; any token outside the k' has a raw
value <= u (u is among the k'), hence a penalised value <= u, and cannot enter (ties at the k-th value
aside, where either choice is a valid top-k, as with `torch.topk`).

    raw top-k' (topk_rows) --> seen? (SeenTokens.contains, a bit test) --> penalise --> top-k of the k'
                                 rows with < k unseen among the k': again with 4k', then exactly

Rows with r < 1 (seen tokens raised, which can climb from anywhere) and rows where the k' never held k
unseen tokens are penalised exactly: every seen token edited in a copy of the row, then `topk_rows`.
This replaces gathering, scaling, scattering and restoring every seen token of every row (~230k entries for
256 rows of 1k-token contexts: ~5 ms of memory-bound work on this CPU) with a bit test of [R, k'].
"""

from __future__ import annotations

import numpy as np
import torch

from engine.sampling.seen_tokens import SeenTokens
from engine.sampling.topk import top_sorted, topk_rows


class SeenPenalty:
    """The repetition penalty of rows that take their top-k as candidates.

    seen_rows: [R] int64, each row's row in the last `seen.sync` (any value where factor is 1);
    factor: [R] float32, the repetition penalty (1: none)."""

    def __init__(self, seen: SeenTokens, seen_rows: np.ndarray, factor: np.ndarray) -> None:
        self.seen, self.seen_rows, self.factor = seen, seen_rows, factor

    def topk(self, x: torch.Tensor, rows: np.ndarray, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [G, V] float32, raw logits of rows `rows` [G] (indices into R) -> the top-k of the penalised
        rows: (values [G, k] float32 sorted descending, ids [G, k] int64), as `topk_rows` of penalised x."""
        factor = self.factor[rows]  # [G]
        if bool((factor == 1.0).all()):
            return topk_rows(x, k)
        width = x.shape[1]
        out_values = np.empty((len(rows), k), dtype=np.float32)
        out_ids = np.empty((len(rows), k), dtype=np.int64)
        pending = np.flatnonzero(factor >= 1.0)  # positions in x; r < 1 goes straight to the exact path
        wide = k + max(16, k // 2)
        while len(pending) and wide <= width // 4:
            sub = x if len(pending) == len(rows) else x[torch.from_numpy(pending)]
            values, ids = (t.numpy() for t in topk_rows(sub, wide))  # [P, k'] each
            f = factor[pending][:, None]  # [P, 1]
            seen = self.seen.contains(self.seen_rows[rows[pending]], ids) & (f != 1.0)  # [P, k']
            penalised = np.where(seen, np.where(values > 0, values / f, values * f), values)
            fits = (~seen).sum(axis=1) >= k
            top_values, top_ids = top_sorted(penalised[fits], ids[fits], k)
            out_values[pending[fits]], out_ids[pending[fits]] = top_values.numpy(), top_ids.numpy()
            pending = pending[~fits]
            wide *= 4
        exact = np.concatenate([pending, np.flatnonzero(factor < 1.0)])  # disjoint
        if len(exact):
            values, ids = topk_rows(self._penalised_copy(x, rows, exact), k)
            out_values[exact], out_ids[exact] = values.numpy(), ids.numpy()
        return torch.from_numpy(out_values), torch.from_numpy(out_ids)

    def _penalised_copy(self, x: torch.Tensor, rows: np.ndarray, which: np.ndarray) -> torch.Tensor:
        """[len(which), V] float32: rows `which` of x with every seen token penalised."""
        out = x[torch.from_numpy(which)].numpy()  # a copy
        for j, pos in enumerate(which.tolist()):
            ids = self.seen.ids(int(self.seen_rows[rows[pos]]))
            f = self.factor[rows[pos]]
            v = out[j, ids]
            out[j, ids] = np.where(v > 0, v / f, v * f)
        return torch.from_numpy(out)

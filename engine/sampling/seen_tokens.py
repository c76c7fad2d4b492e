"""Which token ids each request has seen (prompt + output), kept between steps for the repetition penalty.

The penalty touches only seen tokens, a few hundred per row, so it is applied sparsely: a (row, token) index
pair per distinct seen token, gathered from the logits, scaled and written back. The distinct ids of a
request are found once (on its first step here) and then grow by the step's new tokens, so a step costs
O(new tokens) per row rather than O(context).
"""

from __future__ import annotations

import numpy as np

from engine.core.request import Request


class _Seen:
    __slots__ = ("request", "consumed", "ids", "n", "members")

    def __init__(self, request: Request) -> None:
        tokens = request.token_ids()
        unique = np.unique(np.asarray(tokens, dtype=np.int64))
        self.request = request
        self.consumed = len(tokens)
        self.ids = np.empty(max(16, 2 * len(unique)), dtype=np.int64)  # distinct ids, first n valid
        self.ids[: len(unique)] = unique
        self.n = len(unique)
        self.members = set(unique.tolist())

    def update(self) -> None:
        tokens = self.request.token_ids()
        for t in tokens[self.consumed :]:
            if t not in self.members:
                self.members.add(t)
                if self.n == len(self.ids):
                    self.ids = np.concatenate([self.ids, np.empty_like(self.ids)])
                self.ids[self.n] = t
                self.n += 1
        self.consumed = len(tokens)


class SeenTokens:
    """request_id -> its distinct token ids; entries of requests absent from a step are dropped."""

    def __init__(self) -> None:
        self._by_id: dict[str, _Seen] = {}

    def index(
        self, requests: list[Request], rows: list[int], vocab_size: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """(row, col) int64 arrays: one pair per distinct in-vocab seen token of requests[i] for i in rows."""
        keep: dict[str, _Seen] = {}
        by_id = self._by_id
        cols: list[np.ndarray] = []
        counts: list[int] = []
        for i in rows:
            r = requests[i]
            seen = by_id.get(r.request_id)
            if seen is None or seen.request is not r or seen.consumed > r.num_tokens:
                seen = _Seen(r)
            elif seen.consumed < r.num_tokens:
                seen.update()
            keep[r.request_id] = seen
            cols.append(seen.ids[: seen.n])
            counts.append(seen.n)
        self._by_id = keep
        if not cols:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        row, col = np.repeat(np.asarray(rows, dtype=np.int64), counts), np.concatenate(cols)
        ok = (col >= 0) & (col < vocab_size)
        return row[ok], col[ok]

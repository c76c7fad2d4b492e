"""Which token ids each request has seen (prompt + output), kept between steps for the repetition penalty.

Each request holds a slot while it is in the batch; per slot the state is kept twice:

    bits:  [slots, ceil(V / 8)] uint8, bit t of a row set when token t was seen: membership of any
           [R, K] array of token ids in a few numpy operations (`contains`, for penalising candidates)
    ids:   the distinct in-vocabulary ids, in first-seen order (`index`, for penalising every seen token)

A request's tokens are read once, on its first step here; after that a step adds only the tokens appended
since the last one. In a decode step that is one token per request, handled for the whole batch at once
(a bit test, then a Python append only for rows whose token is new to them), so a step costs
O(batch) numpy work rather than O(context) per row. Requests absent from a step give their slot back; a
request object that replaces another under the same request_id (a new request reusing an id), or one
whose token count went down, starts over.
"""

from __future__ import annotations

import numpy as np

from engine.request_state import SamplingRequest as Request


class _Seen:
    __slots__ = ("request", "slot", "consumed", "ids", "n")

    def __init__(self, request: Request, slot: int) -> None:
        self.request = request
        self.slot = slot
        self.consumed = 0  # tokens of request.token_ids() recorded, as of the last remap
        self.ids = np.empty(64, dtype=np.int64)  # distinct in-vocab ids, first n valid
        self.n = 0

    def extend(self, new: np.ndarray) -> None:
        """new: distinct ids, none recorded yet."""
        if self.n + len(new) > len(self.ids):
            grown = np.empty(max(2 * len(self.ids), self.n + len(new)), dtype=np.int64)
            grown[: self.n] = self.ids[: self.n]
            self.ids = grown
        self.ids[self.n : self.n + len(new)] = new
        self.n += len(new)

    def append(self, token: int) -> None:
        if self.n == len(self.ids):
            self.extend(np.array([token], dtype=np.int64))
        else:
            self.ids[self.n] = token
            self.n += 1


class SeenTokens:
    """request_id -> the distinct token ids it has seen; `sync` once per step, then `contains` / `index`."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self._by_id: dict[str, _Seen] = {}
        self._bits = np.zeros((0, (vocab_size + 7) // 8), dtype=np.uint8)  # [slots, ceil(V / 8)]
        self._free: list[int] = []
        self._requests: list[Request] = []  # the last sync's list, and its entries row by row
        self._entries: list[_Seen] = []
        self._slots = np.empty(0, dtype=np.int64)  # [R]
        self._prompt_lens = np.empty(0, dtype=np.int64)  # [R]
        # [R] tokens recorded per row; the entries' own `consumed` is only written back on a remap.
        self._consumed = np.empty(0, dtype=np.int64)

    def sync(self, requests: list[Request]) -> None:
        """Record the tokens each request gained since the last sync; row i of later calls is requests[i]."""
        if self._requests != requests:
            self._remap(requests)
        lengths = self._prompt_lens + np.array([len(r.output_token_ids) for r in requests], dtype=np.int64)
        gained = lengths - self._consumed  # [R]
        one = np.flatnonzero(gained == 1)  # the decode step's common case
        if len(one):
            last = np.array([requests[i].output_token_ids[-1] for i in one.tolist()], dtype=np.int64)
            self._add_one_each(one, last)
        for i in np.flatnonzero((gained != 0) & (gained != 1)).tolist():
            self._catch_up(i, requests[i])
        self._consumed = lengths

    def contains(self, rows: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """rows [R] int64 (rows of the last sync), ids [R, K] int64 in [0, V) -> [R, K] bool: ids[r, k]
        seen by the request of row rows[r]."""
        byte = self._bits[self._slots[rows][:, None], ids >> 3]  # [R, K] uint8
        return ((byte >> (ids & 7).astype(np.uint8)) & 1).astype(bool)

    def ids(self, row: int) -> np.ndarray:
        """The distinct in-vocab ids seen by row `row` of the last sync (a view: do not keep across syncs)."""
        entry = self._entries[row]
        return entry.ids[: entry.n]

    def index(self, rows: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """(row, col) int64 arrays: one pair per distinct seen token of each of `rows` (rows of the last sync)."""
        if not rows:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        cols = [self.ids(i) for i in rows]
        row = np.repeat(np.asarray(rows, dtype=np.int64), [len(c) for c in cols])
        return row, np.concatenate(cols)

    def _remap(self, requests: list[Request]) -> None:
        """A new batch: keep the entries of requests still here, make entries for new ones, free the rest."""
        for entry, consumed in zip(self._entries, self._consumed.tolist(), strict=True):
            entry.consumed = consumed  # the array is the truth between remaps
        old: dict[str, _Seen] = self._by_id
        by_id: dict[str, _Seen] = {}
        entries: list[_Seen] = []
        fresh: list[int] = []
        for row, r in enumerate(requests):
            kept = old.pop(r.request_id, None)
            if kept is not None and kept.request is not r:
                self._release(kept)
                kept = None
            if kept is None:
                entry = _Seen(r, self._take_slot())
                fresh.append(row)
            else:
                entry = kept
            by_id[r.request_id] = entry
            entries.append(entry)
        for entry in old.values():
            self._release(entry)
        self._by_id = by_id
        self._requests = list(requests)
        self._entries = entries
        self._slots = np.array([e.slot for e in entries], dtype=np.int64)
        self._prompt_lens = np.array([len(r.prompt_token_ids) for r in requests], dtype=np.int64)
        self._consumed = np.array([e.consumed for e in entries], dtype=np.int64)
        for row in fresh:  # a new entry reads the request's whole history once
            self._catch_up(row, requests[row])
            self._consumed[row] = requests[row].num_tokens

    def _add_one_each(self, rows: np.ndarray, tokens: np.ndarray) -> None:
        """rows [N] distinct rows of the last sync, tokens [N]: one new token each."""
        valid = (tokens >= 0) & (tokens < self.vocab_size)
        rows, tokens = rows[valid], tokens[valid]
        slots = self._slots[rows]
        byte, bit = tokens >> 3, (np.uint8(1) << (tokens & 7).astype(np.uint8))
        new = (self._bits[slots, byte] & bit) == 0
        # One (slot, byte) pair per row, slots distinct: the fancy |= writes each pair once.
        self._bits[slots[new], byte[new]] |= bit[new]
        for i, t in zip(rows[new].tolist(), tokens[new].tolist(), strict=True):
            self._entries[i].append(t)

    def _catch_up(self, row: int, request: Request) -> None:
        """Any other gain: record tokens[consumed:] (all of them for a new entry); start over if it shrank."""
        entry = self._entries[row]
        tokens = request.token_ids()
        consumed = int(self._consumed[row])
        if len(tokens) < consumed:  # fewer tokens than recorded: not the same history
            self._bits[entry.slot] = 0
            consumed, entry.n = 0, 0
        fresh = np.asarray(tokens[consumed:], dtype=np.int64)
        fresh = np.unique(fresh[(fresh >= 0) & (fresh < self.vocab_size)])
        if len(fresh):
            byte, bit = fresh >> 3, (np.uint8(1) << (fresh & 7).astype(np.uint8))
            fresh = fresh[(self._bits[entry.slot, byte] & bit) == 0]
            # fresh is sorted and distinct, but two of its ids may share a byte: set bits one id at a time.
            np.bitwise_or.at(self._bits[entry.slot], fresh >> 3, np.uint8(1) << (fresh & 7).astype(np.uint8))
            entry.extend(fresh)

    def _take_slot(self) -> int:
        if not self._free:
            n = len(self._bits)
            grown = max(16, 2 * n)
            self._bits = np.concatenate([self._bits, np.zeros((grown - n, self._bits.shape[1]), np.uint8)])
            self._free = list(range(grown - 1, n - 1, -1))
        return self._free.pop()

    def _release(self, entry: _Seen) -> None:
        self._bits[entry.slot] = 0
        self._free.append(entry.slot)

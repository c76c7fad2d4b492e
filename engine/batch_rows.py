"""The persistent batch (vLLM V1's InputBatch): one row per request the runner knows, holding all a step
reads about it, in numpy columns so that a step works on every row at once.

    row r:  token_ids[r, :num_tokens[r]]      prompt + the outputs the runner knows (num_prompt[r] prompt)
            table[r, :num_blocks[r]]          its KV block ids (0 past the end)
            temperature[r], top_k[r], ...     its sampling parameters; banned[r]: ids barred until min_tokens
            bits[r], seen_ids[r, :num_seen[r]]  the distinct in-vocab ids it has seen, as bits (membership
                                              of any [R, K] ids in a few numpy ops) and as a list (to edit
                                              every seen logit); kept for rows with a repetition penalty only

Rows are dense: `add` takes row n, `remove` moves the last row into the hole (condense), so rows [0, n) are
the live requests. What a request keeps constant (parameters, bans, whether it tracks seen tokens) is
written once by `add`; a step writes what changed, for all its rows at once (`append_tokens`: the sampled
ids, `append_blocks`: a block every block_size tokens). A step's requests in batch order are a `RowView`.
Rows past n are kept zeroed (table, bits), so a row is clean when it is taken.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from engine.batch_view import RowView
from engine.sampling_params import SamplingParams

# The per-row scalar columns: (name, dtype).
_COLUMNS = (
    ("num_tokens", np.int64),
    ("num_prompt", np.int64),
    ("num_blocks", np.int64),
    ("num_seen", np.int64),
    ("temperature", np.float32),
    ("top_k", np.int64),  # vocab_size when off
    ("top_p", np.float32),
    ("min_p", np.float32),
    ("repetition", np.float32),
    ("presence", np.float32),
    ("frequency", np.float32),
    ("seed", np.uint64),  # 0 when unseeded
    ("seeded", np.bool_),
    ("sample_index", np.uint64),
    ("min_tokens", np.int64),
    ("logprobs", np.int64),  # -1: none asked
)


class BatchRows:
    """request id -> a row of every column; add, remove (condensing), and per-step appends."""

    num_tokens: np.ndarray
    num_prompt: np.ndarray
    num_blocks: np.ndarray
    num_seen: np.ndarray
    temperature: np.ndarray
    top_k: np.ndarray
    top_p: np.ndarray
    min_p: np.ndarray
    repetition: np.ndarray
    presence: np.ndarray
    frequency: np.ndarray
    seed: np.ndarray
    seeded: np.ndarray
    sample_index: np.ndarray
    min_tokens: np.ndarray
    logprobs: np.ndarray

    def __init__(
        self,
        vocab_size: int,
        eos_token_ids: frozenset[int] = frozenset(),
        rows: int = 64,
        length: int = 1024,
        width: int = 64,
    ) -> None:
        self.vocab_size = vocab_size
        self.eos_token_ids = frozenset(eos_token_ids)
        self.n = 0  # live rows: [0, n)
        self.ids: list[str] = []  # [n] request id of each row
        self.row_of: dict[str, int] = {}
        self.banned: list[tuple[int, ...]] = []  # [n] ids barred while output < min_tokens
        for name, dtype in _COLUMNS:
            setattr(self, name, np.zeros(rows, dtype=dtype))
        self.token_ids = np.zeros((rows, length), dtype=np.int32)  # [R, L]: int32, as vLLM (half the memory)
        self.seen_ids = np.zeros((rows, length), dtype=np.int32)  # [R, L]
        self.table = np.zeros((rows, width), dtype=np.int32)  # [R, W]
        self.bits = np.zeros((rows, (vocab_size + 7) // 8), dtype=np.uint8)  # [R, ceil(V / 8)]

    def __len__(self) -> int:
        return self.n

    def __contains__(self, request_id: str) -> bool:
        return request_id in self.row_of

    # ------------------------------------------------------------------ add, remove

    def add(
        self,
        request_id: str,
        prompt: Sequence[int],
        output: Sequence[int],
        params: SamplingParams,
        sample_index: int = 0,
    ) -> int:
        """A row for a request new to the batch (an id already here is refused): returns it."""
        if request_id in self.row_of:
            raise ValueError(f"request {request_id} already has row {self.row_of[request_id]}")
        row = self.n
        if row == len(self.num_tokens):
            self._grow(rows=2 * row)
        self.n += 1
        self.ids.append(request_id)
        self.row_of[request_id] = row
        p, vocab = params, self.vocab_size
        self.temperature[row] = p.temperature
        self.top_k[row] = p.top_k if 0 < p.top_k < vocab else vocab
        self.top_p[row], self.min_p[row] = p.top_p, p.min_p
        self.repetition[row] = p.repetition_penalty
        self.presence[row], self.frequency[row] = p.presence_penalty, p.frequency_penalty
        self.seed[row], self.seeded[row] = p.seed or 0, p.seed is not None
        self.sample_index[row] = sample_index
        self.min_tokens[row] = p.min_tokens
        self.logprobs[row] = -1 if p.logprobs is None else p.logprobs
        banned = set(p.stop_token_ids) | (set() if p.ignore_eos else self.eos_token_ids)
        self.banned.append(tuple(sorted(t for t in banned if 0 <= t < vocab)) if p.min_tokens else ())
        self.num_prompt[row] = len(prompt)
        self.set_tokens(row, [*prompt, *output])
        return row

    def remove(self, request_id: str) -> None:
        """Forget a request (absent: nothing); the last row moves into its row, so rows stay dense."""
        row = self.row_of.pop(request_id, None)
        if row is None:
            return
        last = self.n - 1
        if row != last:
            self._move(last, row)
        self.ids.pop()
        self.banned.pop()
        self.n = last
        self.table[last] = 0
        self.bits[last] = 0
        self.num_blocks[last] = self.num_seen[last] = 0

    def _move(self, src: int, dst: int) -> None:
        for name, _ in _COLUMNS:
            col = getattr(self, name)
            col[dst] = col[src]
        self.token_ids[dst, : self.num_tokens[src]] = self.token_ids[src, : self.num_tokens[src]]
        self.seen_ids[dst, : self.num_seen[src]] = self.seen_ids[src, : self.num_seen[src]]
        self.table[dst] = self.table[src]
        self.bits[dst] = self.bits[src]
        rid = self.ids[dst] = self.ids[src]
        self.banned[dst] = self.banned[src]
        self.row_of[rid] = dst

    def _grow(self, rows: int | None = None, length: int | None = None, width: int | None = None) -> None:
        r = rows or len(self.num_tokens)
        if r > len(self.num_tokens):
            for name, dtype in _COLUMNS:
                col = np.zeros(r, dtype=dtype)
                col[: self.n] = getattr(self, name)[: self.n]
                setattr(self, name, col)
        self.token_ids = _resized(self.token_ids, r, length)
        self.seen_ids = _resized(self.seen_ids, r, length)
        self.table = _resized(self.table, r, width)
        self.bits = _resized(self.bits, r, None)

    # ------------------------------------------------------------------ tokens

    def set_tokens(self, row: int, tokens: Sequence[int]) -> None:
        """The row's whole history (prompt + output; the prompt length stays), its seen tokens anew."""
        n = len(tokens)
        if n > self.token_ids.shape[1]:
            self._grow(length=max(n, 2 * self.token_ids.shape[1]))
        self.token_ids[row, :n] = tokens
        self.num_tokens[row] = n
        self.bits[row] = 0
        self.num_seen[row] = 0
        if self.repetition[row] != 1.0:
            self._see_all(row)

    def append_tokens(self, rows: np.ndarray, tokens: np.ndarray) -> None:
        """rows [N] distinct int64, tokens [N] int64: one token appended to each row, all at once."""
        at = self.num_tokens[rows]  # [N]
        if len(at) and at.max() >= self.token_ids.shape[1]:
            self._grow(length=2 * self.token_ids.shape[1])
        self.token_ids[rows, at] = tokens
        self.num_tokens[rows] = at + 1
        tracked = self.repetition[rows] != 1.0
        if tracked.any():
            self._see_one(rows[tracked], tokens[tracked])

    def tokens(self, row: int) -> np.ndarray:
        """[num_tokens] int32, a view: prompt + output of the row."""
        return self.token_ids[row, : self.num_tokens[row]]

    def _see_one(self, rows: np.ndarray, tokens: np.ndarray) -> None:
        """rows [N] distinct, tokens [N]: each row has seen its token."""
        valid = (tokens >= 0) & (tokens < self.vocab_size)
        rows, tokens = rows[valid], tokens[valid]
        byte, bit = tokens >> 3, np.left_shift(np.uint8(1), (tokens & 7).astype(np.uint8))
        new = (self.bits[rows, byte] & bit) == 0
        rows, byte, bit, tokens = rows[new], byte[new], bit[new], tokens[new]
        self.bits[rows, byte] |= bit  # one (row, byte) pair per row: each written once
        self.seen_ids[rows, self.num_seen[rows]] = tokens
        self.num_seen[rows] += 1

    def _see_all(self, row: int) -> None:
        """Record every in-vocab id of the row's tokens (bits and num_seen are clear)."""
        ids = self.tokens(row)
        ids = np.unique(ids[(ids >= 0) & (ids < self.vocab_size)])
        np.bitwise_or.at(self.bits[row], ids >> 3, np.left_shift(np.uint8(1), (ids & 7).astype(np.uint8)))
        self.seen_ids[row, : len(ids)] = ids
        self.num_seen[row] = len(ids)

    # ------------------------------------------------------------------ blocks

    def set_blocks(self, request_id: str, block_ids: Sequence[int]) -> None:
        """The request's block table is exactly `block_ids` (its first step, or after a preemption)."""
        row = self.row_of[request_id]
        self.table[row, : self.num_blocks[row]] = 0
        self.num_blocks[row] = 0
        self._write_blocks(row, block_ids)

    def append_blocks(self, request_id: str, block_ids: Sequence[int]) -> None:
        self._write_blocks(self.row_of[request_id], block_ids)

    def clear_blocks(self, request_id: str) -> None:
        """A preempted request keeps its row (it resumes from its tokens) but no longer owns blocks."""
        row = self.row_of.get(request_id)
        if row is not None:
            self.set_blocks(request_id, ())

    def _write_blocks(self, row: int, block_ids: Sequence[int]) -> None:
        start = int(self.num_blocks[row])
        end = start + len(block_ids)
        if end > self.table.shape[1]:
            self._grow(width=max(end, 2 * self.table.shape[1]))
        if end == start + 1:  # one block appended: the common case, a scalar write
            self.table[row, start] = block_ids[0]
        elif end > start:
            self.table[row, start:end] = block_ids
        self.num_blocks[row] = end

    # ------------------------------------------------------------------ a step's rows

    def view(self, request_ids: list[str]) -> RowView:
        """The rows of `request_ids`, in that order."""
        row_of = self.row_of
        return RowView(self, np.array([row_of[r] for r in request_ids], dtype=np.int64), request_ids)


def _resized(a: np.ndarray, rows: int, cols: int | None) -> np.ndarray:
    """`a` zero-padded to [rows, cols] (cols None: its own), or `a` itself when it fits already."""
    cols = cols or a.shape[1]
    if (rows, cols) == a.shape:
        return a
    out = np.zeros((rows, cols), dtype=a.dtype)
    out[: a.shape[0], : a.shape[1]] = a
    return out

"""One step's requests as rows of the persistent batch (`engine.batch_rows`), in batch order: what a sampler reads.

    position i (row i of the step's logits)  ->  rows[i], a row of BatchRows
    temperature, top_k, ...                  ->  [B] gathered columns, each read at most once per step

Everything is gathered at most once, when first asked, so a greedy step without penalties reads two columns.
The view is valid until the batch next changes (a request added or removed): read it in the step that made it.
"""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from engine.batch_rows import BatchRows


def _gathered(column: str) -> cached_property[np.ndarray]:
    """A [B] gather of one of the batch's columns, made when first read."""

    def gather(view: RowView) -> np.ndarray:
        return getattr(view.batch, column)[view.rows]

    return cached_property(gather)


class RowView:
    def __init__(self, batch: BatchRows, rows: np.ndarray, request_ids: list[str]) -> None:
        self.batch = batch
        self.rows = rows  # [B] int64
        self.request_ids = request_ids  # [B]

    def __len__(self) -> int:
        return len(self.request_ids)

    # [B] each: the step's rows of these columns of the batch.
    temperature = _gathered("temperature")
    top_k = _gathered("top_k")
    top_p = _gathered("top_p")
    min_p = _gathered("min_p")
    repetition = _gathered("repetition")
    presence = _gathered("presence")
    frequency = _gathered("frequency")
    logprobs = _gathered("logprobs")  # top logprobs asked per row, -1 where none

    @cached_property
    def greedy(self) -> np.ndarray:
        """[B] bool: temperature 0."""
        return self.temperature == 0.0

    @cached_property
    def rep_rows(self) -> np.ndarray:
        """Positions whose repetition penalty is not 1."""
        return np.flatnonzero(self.repetition != 1.0)

    @cached_property
    def dense(self) -> bool:
        """Any presence or frequency penalty (they need per-row counts)."""
        return bool((self.presence != 0.0).any() or (self.frequency != 0.0).any())

    @cached_property
    def wants_logprobs(self) -> bool:
        return bool((self.logprobs >= 0).any())

    @cached_property
    def plain_greedy(self) -> bool:
        """Greedy, no penalty, no logprobs: each row's token is its argmax once min_tokens is reached."""
        return (
            bool(self.greedy.all()) and not len(self.rep_rows) and not self.dense and not self.wants_logprobs
        )

    @cached_property
    def output_len(self) -> np.ndarray:
        """[B] int64: outputs so far, the position of each row's next token."""
        rows = self.rows
        return self.batch.num_tokens[rows] - self.batch.num_prompt[rows]

    def seeds_input(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(seed, seeded, sample_index, position) [B] each: `engine.sampling.noise.row_seeds`' arguments."""
        b, rows = self.batch, self.rows
        return b.seed[rows], b.seeded[rows], b.sample_index[rows], self.output_len

    def banned(self) -> tuple[np.ndarray, np.ndarray]:
        """(position [N], token [N]) int64: the ids each row may not produce yet (output < min_tokens)."""
        pending = np.flatnonzero(self.batch.min_tokens[self.rows] > self.output_len).tolist()
        bans = self.batch.banned
        per_row = [bans[self.rows[i]] for i in pending]
        pos = np.repeat(np.asarray(pending, dtype=np.int64), [len(b) for b in per_row])
        return pos, np.fromiter((t for b in per_row for t in b), dtype=np.int64, count=len(pos))

    # ------------------------------------------------------------------ seen tokens, output counts

    def seen_contains(self, positions: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """positions [R], ids [R, K] int64 in [0, V) -> [R, K] bool: ids[r, k] seen by position r's request
        (rows with a repetition penalty only; others see nothing)."""
        byte = self.batch.bits[self.rows[positions][:, None], ids >> 3]  # [R, K] uint8
        return ((byte >> (ids & 7).astype(np.uint8)) & 1).astype(bool)

    def seen_ids(self, position: int) -> np.ndarray:
        """The distinct in-vocab ids seen by the request at `position` (a view)."""
        row = self.rows[position]
        return self.batch.seen_ids[row, : self.batch.num_seen[row]]

    def seen_index(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(position, id) int64 pairs: each distinct seen token of each of `positions`."""
        positions = np.asarray(positions, dtype=np.int64)
        rows = self.rows[positions]
        n = self.batch.num_seen[rows]  # [P]
        if not len(rows):
            return positions, positions
        seen = self.batch.seen_ids
        # Contiguous slices joined by one copy: cheaper than a 2-D gather of every pair.
        cols = np.concatenate([seen[r, :k] for r, k in zip(rows.tolist(), n.tolist(), strict=True)])
        return np.repeat(positions, n), cols

    def output_index(self) -> tuple[np.ndarray, np.ndarray]:
        """(position, token) int64 pairs: every output token of every row (repeats kept: counts)."""
        b, rows = self.batch, self.rows
        start, end = b.num_prompt[rows], b.num_tokens[rows]  # [B]
        if not len(rows) or int(end.max()) == 0:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        cols = np.arange(int(end.max()))[None, :]
        pos, col = np.nonzero((cols >= start[:, None]) & (cols < end[:, None]))
        return pos.astype(np.int64), b.token_ids[rows[pos], col]

    def seen_mask(self, device: torch.device) -> torch.Tensor:
        """[B, V] bool on `device`: the tokens each row has seen (rows with a repetition penalty)."""
        vocab = self.batch.vocab_size
        bits = np.unpackbits(self.batch.bits[self.rows], axis=1, bitorder="little")[:, :vocab]
        return torch.from_numpy(bits.view(np.bool_)).to(device)

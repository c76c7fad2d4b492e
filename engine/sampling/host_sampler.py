"""The host sampler: pick the next token of every row of a step from the model's logits, on the CPU.

Per step, for logits [B, V_padded] float32 (row i belongs to position i of the step's `RowView`), in order:
  1. cut the padding columns: only the tokenizer's `vocab_size` columns count;
  2. logprobs, when asked for, are log_softmax of these *raw* logits (as vLLM returns by default), so they
     describe the model, not the penalties/temperature/truncation of this request;
  3. penalties: repetition (HF, prompt + output), presence and frequency (OpenAI, output only);
  4. min_tokens: EOS (unless ignore_eos) and stop_token_ids get -inf while output < min_tokens;
  5. greedy rows take the argmax; the others go through `engine.sampling.race` (temperature, min_p, top_k,
     top_p, exponential race with per-token noise that is reproducible for seeded rows).
An all-greedy batch without penalties or active min_tokens is one argmax and one device-to-host copy.

The repetition penalty of random rows with a top-k is applied to their top-k candidates only
(`engine.sampling.penalised_topk`, exact); for the other rows it and min_tokens touch few entries per row,
so they are written into the caller's logits in place and the original values put back before returning
(no copy of the [B, V] tensor); presence and frequency penalties, which need per-row counts, work on a
private copy. Everything per row (parameters, seen tokens, output lengths) is a column of the persistent
batch (`engine.batch_rows`), read for the whole step at once.
"""

from __future__ import annotations

import numpy as np
import torch

from engine.batch_view import RowView
from engine.sampling.argmax import argmax_rows
from engine.sampling.interface import (
    RowSampler,
    SampledIds,
    SamplerResult,
    logprob_rows,
    unpack_logprobs,
    vocab_logits,
)
from engine.sampling.noise import row_seeds
from engine.sampling.penalised_topk import SeenPenalty
from engine.sampling.penalties import apply_penalties
from engine.sampling.race import race


class Sampler(RowSampler):
    """TokenSampler for the host. State kept between steps besides the rows': the width of the last
    step's penalised top-k."""

    def __init__(self, vocab_size: int, eos_token_ids: frozenset[int]):
        super().__init__(vocab_size, eos_token_ids)
        # How many candidates beyond k the last step's penalised top-k needed: sizes this step's.
        self._extra = 0

    def launch(self, logits: torch.Tensor, view: RowView) -> SampledIds:
        """Written for the host: the ids are computed (and read) here."""
        return SampledIds.ready(self.sample(logits, view), logits.device)

    def sample(self, logits: torch.Tensor, view: RowView) -> SamplerResult:
        logits = vocab_logits(logits, len(view), self.vocab_size)  # [B, V], maybe a view of the input
        if logits.dtype != torch.float32:
            logits = logits.float()
        bans = view.banned()  # (position, token): rows whose EOS / stop ids are barred this step
        if view.plain_greedy and not len(bans[0]):  # the commonest case: one argmax, one copy to the host
            return SamplerResult(argmax_rows(logits).tolist(), [None] * len(view))
        if bool(view.greedy.all()) and not len(view.rep_rows) and not view.dense and not len(bans[0]):
            tokens = argmax_rows(logits)  # [B] int64
        else:
            work = apply_penalties(logits, view) if view.dense else logits  # all three penalties, a copy
            tokens = torch.from_numpy(self._sample(work, view, bans))
        if not view.wants_logprobs:
            return SamplerResult(tokens.tolist(), [None] * len(view))
        return unpack_logprobs(logprob_rows(logits, tokens, view).tolist(), view.logprobs)

    def repetition(self, view: RowView) -> tuple[SeenPenalty | None, np.ndarray, np.ndarray]:
        """The repetition penalty of this step: (the penalty of random top-k rows, applied to their
        candidates by `race`; row [N] and col [N] int64: the seen tokens of the other penalised rows, to edit)."""
        rep_rows = view.rep_rows  # [P]
        if not len(rep_rows) or view.dense:  # dense: the caller applied every penalty to a copy
            return None, np.empty(0, np.int64), np.empty(0, np.int64)
        # Random rows with a top-k: the penalty on their candidates only (exact, see penalised_topk).
        by_candidates = ~view.greedy[rep_rows] & (view.top_k[rep_rows] < self.vocab_size)  # [P]
        penalty = None
        if by_candidates.any():
            factor = np.ones(len(view), dtype=np.float32)  # [B]
            factor[rep_rows[by_candidates]] = view.repetition[rep_rows[by_candidates]]
            penalty = SeenPenalty(view, np.arange(len(view)), factor, self._extra)
        row, col = view.seen_index(rep_rows[~by_candidates])
        return penalty, row, col

    def _sample(self, logits: torch.Tensor, view: RowView, bans: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        """[B] int64 tokens. logits: [B, V] float32, edited in place and restored before returning. The
        repetition penalty (unless view.dense, where the caller applied it) goes to random top-k rows through
        `SeenPenalty`, to the other rows as sparse edits of every seen token."""
        dev = logits.device
        edits = _SparseEdits(logits)
        penalty, row, col = self.repetition(view)
        if len(row):
            rows, cols = torch.from_numpy(row).to(dev), torch.from_numpy(col).to(dev)
            x = edits.get(rows, cols)  # [N]: each distinct seen token of each edited row
            rep = torch.from_numpy(view.repetition).to(dev)[rows]
            edits.put(rows, cols, torch.where(x > 0, x / rep, x * rep), old=x)
        if len(bans[0]):
            rows, cols = torch.from_numpy(bans[0]).to(dev), torch.from_numpy(bans[1]).to(dev)
            edits.put(rows, cols, torch.full((len(rows),), -float("inf"), device=dev))
        try:
            out = np.zeros(len(view), dtype=np.int64)
            greedy = view.greedy
            greedy_rows = np.flatnonzero(greedy)
            if len(greedy_rows):
                whole = len(greedy_rows) == len(view)
                sub = logits if whole else logits[torch.from_numpy(greedy_rows).to(dev)]
                out[greedy_rows] = argmax_rows(sub).cpu().numpy()
            random_rows = np.flatnonzero(~greedy)
            if len(random_rows):
                whole = len(random_rows) == len(view)
                sub = logits if whole else logits[torch.from_numpy(random_rows).to(dev)]
                r = slice(None) if whole else random_rows
                seed, seeded, index, position = view.seeds_input()
                seeds = row_seeds(seed[r], seeded[r], index[r], position[r])
                race_penalty = penalty if whole or penalty is None else penalty.subset(random_rows)
                out[r] = race(
                    sub, view.temperature[r], view.top_k[r], view.top_p[r], view.min_p[r], seeds, race_penalty
                )
                if race_penalty is not None:
                    self._extra = race_penalty.extra
            return out
        finally:
            edits.restore()


class _SparseEdits:
    """Writes into a [B, V] tensor at (row, col) pairs, remembering the old values to put them back.

    On a contiguous tensor through a flat view (index_select / index_copy_, an order of magnitude cheaper
    than 2-D advanced indexing on the CPU); otherwise by 2-D indexing."""

    def __init__(self, x: torch.Tensor) -> None:
        self.x = x
        self._flat = x.view(-1) if x.is_contiguous() else None
        self._undo: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def get(self, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        if self._flat is not None:
            return self._flat.index_select(0, rows * self.x.shape[1] + cols)
        return self.x[rows, cols]

    def put(
        self, rows: torch.Tensor, cols: torch.Tensor, values: torch.Tensor, old: torch.Tensor | None = None
    ) -> None:
        """old: what get(rows, cols) returned just before, if the caller has it (saves reading it again)."""
        self._undo.append((rows, cols, self.get(rows, cols) if old is None else old))
        self._write(rows, cols, values.to(self.x.dtype))

    def _write(self, rows: torch.Tensor, cols: torch.Tensor, values: torch.Tensor) -> None:
        if self._flat is not None:
            self._flat.index_copy_(0, rows * self.x.shape[1] + cols, values)
        else:
            self.x.index_put_((rows, cols), values)

    def restore(self) -> None:
        for rows, cols, old in reversed(self._undo):
            self._write(rows, cols, old)
        self._undo.clear()

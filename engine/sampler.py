"""Pick the next token of every running request from the model's logits.

Per step, for logits [B, V_padded] float32 (row i belongs to requests[i]), in this order:
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
private copy.

State kept between steps (vLLM's persistent batch): the rows' parameters as arrays, rebuilt only when the
list of request objects changes (`engine.sampling.batch_params`), and each request's seen tokens, grown by
the step's new tokens (`engine.sampling.seen_tokens`). Row seeds are hashed for the whole batch at once
(`engine.sampling.noise.row_seeds`). So the per-request Python of a decode step is a few list
comprehensions over the batch (output lengths, last tokens), not a rebuild of each request's inputs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from engine.outputs import TokenLogprobs
from engine.request_state import SamplingRequest as Request
from engine.sampling.argmax import argmax_rows
from engine.sampling.batch_params import BatchParams, output_lengths
from engine.sampling.noise import row_seeds
from engine.sampling.penalised_topk import SeenPenalty
from engine.sampling.penalties import apply_penalties, min_tokens_banned
from engine.sampling.race import race
from engine.sampling.seen_tokens import SeenTokens


@dataclass(frozen=True)
class SamplerResult:
    token_ids: list[int]
    # Per request: None unless its params.logprobs is set; else the sampled token first, then the top-k by
    # descending logprob (the sampled token may appear twice).
    logprobs: list[TokenLogprobs | None]


class SampledIds:
    """One step's sampled ids as the device holds them, read by the host only when it needs them.

    `tokens()`: [B] int64 on the device (the next step's input ids take them from here, async scheduling);
    `read()`: the step's one device-to-host transfer, done once (ids, and logprobs when asked)."""

    def __init__(
        self,
        tokens: torch.Tensor | None,
        read: Callable[[], SamplerResult],
        device: torch.device | None = None,
    ) -> None:
        self._tokens, self._read, self._device = tokens, read, device
        self._result: SamplerResult | None = None

    @classmethod
    def ready(cls, result: SamplerResult, device: torch.device) -> SampledIds:
        """Ids the host already holds (the CPU sampler): tokens() is built from them when asked."""
        done = cls(None, lambda: result, device)
        done._result = result
        return done

    def tokens(self) -> torch.Tensor:
        if self._tokens is None:
            self._tokens = torch.tensor(self.read().token_ids, dtype=torch.int64).to(self._device)
        return self._tokens

    def read(self) -> SamplerResult:
        if self._result is None:
            self._result = self._read()
        return self._result


class TokenSampler(Protocol):
    """What the model runner calls once per step: one token (and optional logprobs) per row of logits.
    `launch` queues the work and returns at once where the device allows; `__call__` is launch + read."""

    def launch(self, logits: torch.Tensor, requests: list[Request]) -> SampledIds: ...

    def __call__(self, logits: torch.Tensor, requests: list[Request]) -> SamplerResult: ...


def vocab_logits(logits: torch.Tensor, rows: int, vocab_size: int) -> torch.Tensor:
    """logits [rows, V_padded] -> the view [rows, vocab_size]: the padding columns never count."""
    if logits.dim() != 2 or logits.shape[0] != rows or logits.shape[1] < vocab_size:
        raise ValueError(f"logits {tuple(logits.shape)} do not fit {rows} requests x vocab {vocab_size}")
    return logits[:, :vocab_size]


class Sampler:
    """Keeps per-batch state between steps: the rows' parameters as arrays (`BatchParams`, rebuilt when the
    list of requests differs from the last step's) and each request's seen tokens (`SeenTokens`)."""

    def __init__(self, vocab_size: int, eos_token_ids: frozenset[int]):
        self.vocab_size = vocab_size
        self.eos_token_ids = frozenset(eos_token_ids)
        self._seen = SeenTokens(vocab_size)
        self._params: BatchParams | None = None
        # How many candidates beyond k the last step's penalised top-k needed: sizes this step's.
        self._extra = 0

    def batch_params(self, requests: list[Request]) -> BatchParams:
        """The rows' parameters, reused while the batch is the same list of request objects."""
        self._params = BatchParams.reuse(self._params, requests, self.vocab_size)
        return self._params

    def launch(self, logits: torch.Tensor, requests: list[Request]) -> SampledIds:
        """Written for the host: the ids are computed (and read) here."""
        return SampledIds.ready(self(logits, requests), logits.device)

    def __call__(self, logits: torch.Tensor, requests: list[Request]) -> SamplerResult:
        logits = vocab_logits(logits, len(requests), self.vocab_size)  # [B, V], maybe a view of the input
        if logits.dtype != torch.float32:
            logits = logits.float()
        bp = self.batch_params(requests)
        pending = bp.min_tokens_pending()  # rows whose EOS / stop ids are banned this step
        if bp.plain_greedy and not pending:  # the commonest case: one argmax, one copy to the host
            return SamplerResult(argmax_rows(logits).tolist(), [None] * len(requests))
        raw_logprobs = torch.log_softmax(logits, dim=-1) if bp.logprobs else None  # [B, V] float32
        banned = {i: min_tokens_banned(requests[i], self.eos_token_ids) for i in pending}
        banned = {i: ts for i, ts in banned.items() if ts}
        if bool(bp.greedy.all()) and not bp.rep_rows and not bp.dense and not banned:
            tokens = argmax_rows(logits)  # [B] int64
            return SamplerResult(tokens.tolist(), _gather_logprobs(raw_logprobs, tokens, requests))
        work = logits
        if bp.dense:
            work = logits.clone()
            apply_penalties(work, requests)  # all three penalties, dense
        token_ids = self._sample(work, bp, banned)
        tokens = torch.tensor(token_ids, dtype=torch.int64, device=logits.device)
        return SamplerResult(token_ids, _gather_logprobs(raw_logprobs, tokens, requests))

    def repetition(self, bp: BatchParams) -> tuple[SeenPenalty | None, np.ndarray, np.ndarray]:
        """The repetition penalty of this step: (the penalty of random top-k rows, applied to their
        candidates by `race`; row [N] and col [N] int64: the seen tokens of the other penalised rows, to edit)."""
        if not bp.rep_rows or bp.dense:  # dense: the caller applied every penalty to a copy
            return None, np.empty(0, np.int64), np.empty(0, np.int64)
        rep_rows = np.asarray(bp.rep_rows, dtype=np.int64)  # [P]
        self._seen.sync([bp.requests[i] for i in bp.rep_rows])
        # Random rows with a top-k: the penalty on their candidates only (exact, see penalised_topk).
        by_candidates = ~bp.greedy[rep_rows] & (bp.top_k[rep_rows] < self.vocab_size)  # [P]
        penalty = None
        if by_candidates.any():
            seen_rows = np.zeros(len(bp.requests), dtype=np.int64)  # [B]: the row's row in the seen sync
            seen_rows[rep_rows] = np.arange(len(rep_rows))
            factor = np.ones(len(bp.requests), dtype=np.float32)  # [B]
            factor[rep_rows[by_candidates]] = bp.repetition[rep_rows[by_candidates]]
            penalty = SeenPenalty(self._seen, seen_rows, factor, self._extra)
        row, col = self._seen.index(np.flatnonzero(~by_candidates).tolist())
        return penalty, rep_rows[row], col

    def _sample(self, logits: torch.Tensor, bp: BatchParams, banned: dict[int, list[int]]) -> list[int]:
        """logits: [B, V] float32, edited in place and restored before returning. The repetition penalty
        (unless bp.dense, where the caller applied it) goes to random top-k rows through `SeenPenalty`, to
        the other rows as sparse edits of every seen token."""
        dev = logits.device
        requests = bp.requests
        edits = _SparseEdits(logits)
        penalty, row, col = self.repetition(bp)
        if len(row):
            rows, cols = torch.from_numpy(row).to(dev), torch.from_numpy(col).to(dev)
            x = edits.get(rows, cols)  # [N]: each distinct seen token of each edited row
            rep = torch.from_numpy(bp.repetition).to(dev)[rows]
            edits.put(rows, cols, torch.where(x > 0, x / rep, x * rep), old=x)
        pairs = [(i, t) for i, ts in banned.items() for t in ts if t < self.vocab_size]
        if pairs:
            rows = torch.tensor([i for i, _ in pairs], dtype=torch.int64, device=dev)
            cols = torch.tensor([t for _, t in pairs], dtype=torch.int64, device=dev)
            edits.put(rows, cols, torch.full((len(pairs),), -float("inf"), device=dev))
        try:
            out = np.zeros(len(requests), dtype=np.int64)
            greedy_rows = np.flatnonzero(bp.greedy)
            if len(greedy_rows):
                whole = len(greedy_rows) == len(requests)
                sub = logits if whole else logits[torch.from_numpy(greedy_rows).to(dev)]
                out[greedy_rows] = argmax_rows(sub).cpu().numpy()
            random_rows = np.flatnonzero(~bp.greedy)
            if len(random_rows):
                whole = len(random_rows) == len(requests)
                sub = logits if whole else logits[torch.from_numpy(random_rows).to(dev)]
                r = slice(None) if whole else random_rows
                positions = output_lengths(requests if whole else [requests[i] for i in random_rows])
                seeds = row_seeds(bp.seed[r], bp.seeded[r], bp.sample_index[r], positions)
                race_penalty = penalty if whole or penalty is None else penalty.subset(random_rows)
                out[r] = race(
                    sub, bp.temperature[r], bp.top_k[r], bp.top_p[r], bp.min_p[r], seeds, race_penalty
                )
                if race_penalty is not None:
                    self._extra = race_penalty.extra
            return out.tolist()
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


def _gather_logprobs(
    raw_logprobs: torch.Tensor | None, tokens: torch.Tensor, requests: list[Request]
) -> list[TokenLogprobs | None]:
    """raw_logprobs: [B, V] float32 or None; tokens: [B] int64. One device-to-host copy per tensor."""
    if raw_logprobs is None:
        return [None] * len(requests)
    tokens = tokens.to(raw_logprobs.device)
    max_k = max(r.params.logprobs or 0 for r in requests)
    sampled = raw_logprobs.gather(1, tokens[:, None]).squeeze(1).tolist()  # [B]
    top_values: list[list[float]] = [[] for _ in requests]
    top_ids: list[list[int]] = [[] for _ in requests]
    if max_k > 0:
        top = raw_logprobs.topk(min(max_k, raw_logprobs.shape[1]), dim=-1)  # values/indices: [B, k]
        top_values, top_ids = top.values.tolist(), top.indices.tolist()
    token_ids = tokens.tolist()
    out: list[TokenLogprobs | None] = []
    for i, r in enumerate(requests):
        k = r.params.logprobs
        if k is None:
            out.append(None)
            continue
        out.append([(token_ids[i], sampled[i])] + list(zip(top_ids[i][:k], top_values[i][:k], strict=True)))
    return out

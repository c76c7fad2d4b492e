"""The sampling parameters of a step's rows as arrays, built when the batch changes and reused while it does not.

A decode step usually samples the same requests in the same order as the step before (vLLM's "persistent
batch" observation), so the per-request Python that reads each request's parameters runs only when the
list of request objects differs from the last step's (compared by identity, one C-level pass; in the
engine they are the runner's own `RequestState`s, which live as long as the request). What
changes every step without a change of batch, each row's output length (the seeded position and the
min_tokens progress), is read per step (`output_lengths`), and only for the rows that need it.

    rows:           0      1      2     ...   B-1       (row i is requests[i])
    temperature:   [B] float32; greedy [B] bool (temperature 0)
    top_k:         [B] int64, V when off; top_p, min_p, repetition [B] float32
    seed:          [B] uint64 (0 when unseeded), seeded [B] bool, sample_index [B] uint64
    min_tokens:    [B] int64; min_rows: the rows with min_tokens > 0 (the only ones whose bans can change)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.request_state import SamplingRequest as Request


@dataclass(frozen=True, eq=False)
class BatchParams:
    requests: list[Request]  # a copy of the step's list: rows by identity
    temperature: np.ndarray
    greedy: np.ndarray
    top_k: np.ndarray
    top_p: np.ndarray
    min_p: np.ndarray
    repetition: np.ndarray
    seed: np.ndarray
    seeded: np.ndarray
    sample_index: np.ndarray
    min_tokens: np.ndarray
    min_rows: list[int]
    # Rows whose repetition_penalty is not 1, in row order.
    rep_rows: list[int]
    # Any row with presence or frequency penalty (the dense path), any row asking for logprobs.
    dense: bool
    logprobs: bool
    # Greedy, no penalty, no logprobs: the row's token is its argmax once min_tokens is reached.
    plain_greedy: bool

    @classmethod
    def build(cls, requests: list[Request], vocab_size: int) -> BatchParams:
        params = [r.params for r in requests]
        top_k = [p.top_k if 0 < p.top_k < vocab_size else vocab_size for p in params]
        temperature = np.array([p.temperature for p in params], dtype=np.float32)
        repetition = np.array([p.repetition_penalty for p in params], dtype=np.float32)
        min_tokens = np.array([p.min_tokens for p in params], dtype=np.int64)
        dense = any(p.presence_penalty != 0.0 or p.frequency_penalty != 0.0 for p in params)
        logprobs = any(p.logprobs is not None for p in params)
        greedy = temperature == 0.0
        return cls(
            requests=list(requests),
            temperature=temperature,
            greedy=greedy,
            top_k=np.array(top_k, dtype=np.int64),
            top_p=np.array([p.top_p for p in params], dtype=np.float32),
            min_p=np.array([p.min_p for p in params], dtype=np.float32),
            repetition=repetition,
            seed=np.array([p.seed or 0 for p in params], dtype=np.uint64),
            seeded=np.array([p.seed is not None for p in params], dtype=bool),
            sample_index=np.array([r.sample_index for r in requests], dtype=np.uint64),
            min_tokens=min_tokens,
            min_rows=np.flatnonzero(min_tokens > 0).tolist(),
            rep_rows=np.flatnonzero(repetition != 1.0).tolist(),
            dense=dense,
            logprobs=logprobs,
            plain_greedy=bool(greedy.all())  # True for no rows, as before
            and not dense
            and not logprobs
            and bool((repetition == 1.0).all()),
        )

    @classmethod
    def reuse(cls, last: BatchParams | None, requests: list[Request], vocab_size: int) -> BatchParams:
        """`last` while the batch is the same list of request objects, else built anew."""
        return last if last is not None and last.matches(requests) else cls.build(requests, vocab_size)

    def matches(self, requests: list[Request]) -> bool:
        """The same request objects in the same order (Request compares by identity)."""
        return self.requests == requests

    def min_tokens_pending(self) -> list[int]:
        """Rows that have not reached min_tokens yet (their EOS / stop ids are banned this step)."""
        reqs, mins = self.requests, self.min_tokens
        return [i for i in self.min_rows if len(reqs[i].output_token_ids) < mins[i]]


def output_lengths(requests: list[Request]) -> np.ndarray:
    """[B] int64: len(output_token_ids) of each row, the position of its next token."""
    return np.array([len(r.output_token_ids) for r in requests], dtype=np.int64)

"""Temperature, min_p, top_k and top_p, then the exponential race, over each row's candidate tokens.

Rows are grouped by how their candidates are found, which depends only on the row's own parameters:

    top_k = k < V       candidates = topk(k): [R, k], sorted descending (`engine.sampling.topk`: no full
                        sort, no full-width selection)
    top_p < 1 only      candidates = the shortest top-K holding the nucleus (`engine.sampling.nucleus`),
                        sorted descending: [R, K], padded with -inf
    neither             every token: drawn by inverse transform instead of the race (`engine.sampling.inverse_cdf`:
                        one uniform per row, no noise per token)

Within a group every step is row-wise, so a row's token does not depend on which rows share its batch.
Weights are w_t = exp((x_t - x_max) / T), i.e. probabilities up to a per-row factor:
  min_p cuts w_t < min_p (relative to the most likely token, as in vLLM/HF);
  top_p cuts a token once the kept mass strictly before it exceeds top_p x the mass top_k kept (HF/vLLM order:
  min_p, top_k, top_p); the most likely token always survives.
The token is argmax over candidates of w_t / q_t, q_t ~ Exp(1) from `engine.sampling.noise`.

A repetition penalty given as `penalty` (`engine.sampling.penalised_topk`) is applied by the top-k group to
its candidates; rows of the other groups must come with it already applied to their logits.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from engine.sampling.argmax import argmax_rows
from engine.sampling.inverse_cdf import sample_by_cdf
from engine.sampling.noise import as_seeds, exponential_noise
from engine.sampling.nucleus import nucleus_candidates
from engine.sampling.penalised_topk import SeenPenalty
from engine.sampling.topk import topk_rows


def race(
    logits: torch.Tensor,
    temperature: Sequence[float] | np.ndarray,
    top_k: Sequence[int] | np.ndarray,
    top_p: Sequence[float] | np.ndarray,
    min_p: Sequence[float] | np.ndarray,
    seeds: torch.Tensor | np.ndarray,
    penalty: SeenPenalty | None = None,
) -> list[int]:
    """logits: [R, V] float32; per-row parameters [R] (lists or arrays; top_k >= V or <= 0: off);
    seeds: [R] row seeds (`noise.as_seeds`); penalty: the repetition penalty of top-k rows, None when logits carry it.
    Returns the R sampled token ids."""
    vocab_size, dev = logits.shape[1], logits.device
    seeds = as_seeds(seeds)
    temperature = np.asarray(temperature, dtype=np.float32)
    min_p = np.asarray(min_p, dtype=np.float32)
    top_p = np.asarray(top_p, dtype=np.float32)
    top_k = np.asarray(top_k, dtype=np.int64)
    # Group key: k for top-k rows, V for top-p-only rows, V + 1 for rows whose candidates are every token.
    key = np.where(
        (top_k > 0) & (top_k < vocab_size), top_k, np.where(top_p < 1.0, vocab_size, vocab_size + 1)
    )
    out = np.zeros(len(temperature), dtype=np.int64)
    for k in np.unique(key).tolist():
        rows = np.flatnonzero(key == k)  # [G]
        whole = len(rows) == logits.shape[0]
        sub = logits if whole else logits[torch.from_numpy(rows).to(dev)]  # [G, V]
        t = torch.from_numpy(temperature[rows]).to(dev)[:, None]  # [G, 1]
        mp = torch.from_numpy(min_p[rows]).to(dev)[:, None]
        tp = torch.from_numpy(top_p[rows]).to(dev)[:, None]
        if k == vocab_size + 1:  # every token a candidate: inverse transform, one uniform per row
            w = torch.exp((sub - sub.amax(dim=-1, keepdim=True)) / t)  # [G, V]; the max is 1
            if bool((mp > 0).any()):
                w = w.masked_fill(w < mp, 0.0)
            out[rows] = sample_by_cdf(w, seeds[torch.from_numpy(rows)]).cpu().numpy()
            continue
        mass = None  # [G, 1] the mass top_p is relative to, when not the candidates' own
        if k < vocab_size:
            values, ids = topk_rows(sub, k) if penalty is None else penalty.topk(sub, rows, k)  # [G, k]
        else:
            values, ids, mass = nucleus_candidates(sub, t, tp, mp)  # [G, K], K << V as a rule
        w = torch.exp((values - values.amax(dim=-1, keepdim=True)) / t)  # [G, K]; the max is 1
        if bool((mp > 0).any()):
            w = w.masked_fill(w < mp, 0.0)
        if bool((tp < 1.0).any()):
            before = w.cumsum(dim=-1) - w  # kept mass strictly before each candidate
            total = w.sum(dim=-1, keepdim=True) if mass is None else mass
            w = w.masked_fill((before > tp * total) & (tp < 1.0), 0.0)
        q = exponential_noise(seeds[torch.from_numpy(rows)], ids)  # [G, K]
        choice = argmax_rows(w / q)[:, None]  # [G, 1]
        out[rows] = ids.gather(1, choice.to(ids.device)).squeeze(1).cpu().numpy()
    return out.tolist()

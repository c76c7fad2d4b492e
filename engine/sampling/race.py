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
"""

from __future__ import annotations

import numpy as np
import torch

from engine.sampling.argmax import argmax_rows
from engine.sampling.inverse_cdf import sample_by_cdf
from engine.sampling.noise import exponential_noise
from engine.sampling.nucleus import nucleus_candidates
from engine.sampling.topk import topk_rows


def race(
    logits: torch.Tensor,
    temperature: list[float],
    top_k: list[int],
    top_p: list[float],
    min_p: list[float],
    seeds: np.ndarray,
) -> list[int]:
    """logits: [R, V] float32 (penalties applied); per-row parameters as lists (top_k >= V: off);
    seeds: [R] uint64. Returns the R sampled token ids."""
    vocab_size, dev = logits.shape[1], logits.device
    groups: dict[tuple[str, int], list[int]] = {}
    for i, (k, p) in enumerate(zip(top_k, top_p, strict=True)):
        key = ("topk", k) if 0 < k < vocab_size else ("sort", vocab_size) if p < 1.0 else ("all", vocab_size)
        groups.setdefault(key, []).append(i)
    out = [0] * len(temperature)
    for (how, k), rows in groups.items():
        sub = logits[rows] if len(rows) < logits.shape[0] else logits  # [G, V]
        t = torch.tensor([temperature[i] for i in rows], dtype=torch.float32, device=dev)[:, None]  # [G, 1]
        mp = torch.tensor([min_p[i] for i in rows], dtype=torch.float32, device=dev)[:, None]
        tp = torch.tensor([top_p[i] for i in rows], dtype=torch.float32, device=dev)[:, None]
        if how == "all":  # every token a candidate: inverse transform, one uniform per row
            w = torch.exp((sub - sub.amax(dim=-1, keepdim=True)) / t)  # [G, V]; the max is 1
            if bool((mp > 0).any()):
                w = w.masked_fill(w < mp, 0.0)
            for i, token in zip(rows, sample_by_cdf(w, seeds[rows]).tolist(), strict=True):
                out[i] = token
            continue
        mass = None  # [G, 1] the mass top_p is relative to, when not the candidates' own
        if how == "topk":
            values, ids = topk_rows(sub, k)  # [G, k] each, sorted descending
        else:
            values, ids, mass = nucleus_candidates(sub, t, tp, mp)  # [G, K], K << V as a rule
        w = torch.exp((values - values.amax(dim=-1, keepdim=True)) / t)  # [G, K]; the max is 1
        if bool((mp > 0).any()):
            w = w.masked_fill(w < mp, 0.0)
        if bool((tp < 1.0).any()):
            before = w.cumsum(dim=-1) - w  # kept mass strictly before each candidate
            total = w.sum(dim=-1, keepdim=True) if mass is None else mass
            w = w.masked_fill((before > tp * total) & (tp < 1.0), 0.0)
        q = exponential_noise(seeds[rows], ids.cpu()).to(dev)  # [G, K]; hashed on the host
        choice = argmax_rows(w / q)[:, None]  # [G, 1]
        for i, token in zip(rows, ids.gather(1, choice).squeeze(1).tolist(), strict=True):
            out[i] = token
    return out

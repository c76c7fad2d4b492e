"""Logit penalties and masks that depend on a request's tokens so far.

All functions edit `logits` in place; `logits` is [B, V] float32 with V = the tokenizer's vocab size
(padding columns already cut off), and row i belongs to `requests[i]`.
"""

from __future__ import annotations

import itertools

import torch

from engine.request_state import SamplingRequest as Request


def token_counts(rows: list[list[int]], vocab_size: int, device: torch.device) -> torch.Tensor:
    """counts: [B, V] float32, counts[i, t] = how often token t occurs in rows[i] (ids outside [0, V) ignored).

    One flat host-to-device copy and one index_add over `row * V + id`, whatever the row lengths.
    """
    flat = torch.tensor(list(itertools.chain.from_iterable(rows)), dtype=torch.int64)  # [sum(L)]
    row = torch.repeat_interleave(torch.arange(len(rows)), torch.tensor([len(r) for r in rows]))  # [sum(L)]
    keep = (flat >= 0) & (flat < vocab_size)
    index = (row[keep] * vocab_size + flat[keep]).to(device)
    counts = torch.zeros(len(rows) * vocab_size, dtype=torch.float32, device=device)  # [B * V]
    ones = torch.ones(index.shape, dtype=torch.float32, device=device)
    counts.index_add_(0, index, ones)  # sums of ones: exact, whatever the order
    return counts.view(len(rows), vocab_size)


def needs_penalties(request: Request) -> bool:
    p = request.params
    return p.repetition_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0


def apply_penalties(logits: torch.Tensor, requests: list[Request]) -> None:
    """Repetition (HF), presence and frequency (OpenAI) penalties, vectorised over the batch.

    repetition_penalty r over prompt + output tokens: a seen token's logit x becomes x / r if x > 0, else x * r.
    presence p and frequency f over output tokens only: x -= f * count + p * (count > 0).
    """
    device = logits.device
    vocab_size = logits.shape[1]
    params = [r.params for r in requests]
    rep = torch.tensor([p.repetition_penalty for p in params], dtype=torch.float32, device=device)[:, None]
    if bool((rep != 1.0).any()):
        seen = token_counts([r.token_ids() for r in requests], vocab_size, device) > 0  # [B, V] bool
        factor = torch.where(logits > 0, 1.0 / rep, rep)  # [B, V] float32
        logits.mul_(torch.where(seen, factor, 1.0))
    freq = torch.tensor([p.frequency_penalty for p in params], dtype=torch.float32, device=device)[:, None]
    pres = torch.tensor([p.presence_penalty for p in params], dtype=torch.float32, device=device)[:, None]
    if bool((freq != 0.0).any() or (pres != 0.0).any()):
        counts = token_counts([r.output_token_ids for r in requests], vocab_size, device)  # [B, V] float32
        logits -= freq * counts + pres * (counts > 0).float()


def min_tokens_banned(request: Request, eos_token_ids: frozenset[int]) -> list[int]:
    """Token ids this request may not produce yet because it has fewer than min_tokens outputs."""
    p = request.params
    if len(request.output_token_ids) >= p.min_tokens:
        return []
    banned = set(p.stop_token_ids)
    if not p.ignore_eos:
        banned |= eos_token_ids
    return sorted(banned)


def apply_min_tokens(logits: torch.Tensor, requests: list[Request], eos_token_ids: frozenset[int]) -> None:
    """Set the logits of EOS (unless ignore_eos) and stop_token_ids to -inf while output < min_tokens."""
    vocab_size = logits.shape[1]
    rows: list[int] = []
    cols: list[int] = []
    for i, r in enumerate(requests):
        for t in min_tokens_banned(r, eos_token_ids):
            if t < vocab_size:
                rows.append(i)
                cols.append(t)
    if rows:
        logits[torch.tensor(rows, device=logits.device), torch.tensor(cols, device=logits.device)] = -float(
            "inf"
        )

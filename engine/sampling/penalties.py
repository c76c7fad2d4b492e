"""Logit penalties that depend on a request's tokens so far, from the persistent batch's rows; the host and
the device sampler share them.

`logits` is [B, V] float32 with V = the tokenizer's vocab size (padding columns already cut off), and row
i belongs to position i of the step's `RowView`.
"""

from __future__ import annotations

import numpy as np
import torch

from engine.batch_view import RowView
from engine.host_to_device import to_device


def token_counts(
    positions: np.ndarray, ids: np.ndarray, rows: int, vocab_size: int, device: torch.device
) -> torch.Tensor:
    """counts: [rows, V] float32, counts[positions[j], ids[j]] += 1 for each pair (ids outside [0, V) ignored).

    One flat host-to-device copy and one index_add over `position * V + id`, whatever the row lengths."""
    keep = (ids >= 0) & (ids < vocab_size)
    index = to_device(positions[keep] * vocab_size + ids[keep], device, torch.int64)
    counts = torch.zeros(rows * vocab_size, dtype=torch.float32, device=device)  # [B * V]
    counts.index_add_(0, index, torch.ones(index.shape, dtype=torch.float32, device=device))  # exact sums
    return counts.view(rows, vocab_size)


def apply_penalties(logits: torch.Tensor, view: RowView) -> torch.Tensor:
    """Repetition (HF), presence and frequency (OpenAI) penalties, vectorised over the batch; a new tensor.

    repetition_penalty r over prompt + output tokens: a seen token's logit x becomes x / r if x > 0, else x * r.
    presence p and frequency f over output tokens only: x -= f * count + p * (count > 0).
    """
    device, (rows, vocab) = logits.device, logits.shape
    if len(view.rep_rows):
        rep = to_device(view.repetition, device)[:, None]  # [B, 1]
        penalised = torch.where(logits > 0, logits / rep, logits * rep)
        logits = torch.where(view.seen_mask(device), penalised, logits)
    if view.dense:
        counts = token_counts(*view.output_index(), rows, vocab, device)  # [B, V]
        f = to_device(view.frequency, device)[:, None]
        p = to_device(view.presence, device)[:, None]
        logits = logits - (f * counts + p * (counts > 0).float())
    return logits


def apply_bans(logits: torch.Tensor, positions: np.ndarray, ids: np.ndarray) -> None:
    """logits[positions[j], ids[j]] = -inf in place (`RowView.banned()`: EOS and stop ids of rows short
    of min_tokens); any view, contiguous or not."""
    dev = logits.device
    index = (to_device(positions, dev, torch.int64), to_device(ids, dev, torch.int64))
    logits.index_put_(index, torch.tensor(-float("inf"), device=dev))

"""min_p, top_k and top_p: turn tempered logits into (unnormalised) probabilities with the tail cut off."""

from __future__ import annotations

import torch


def truncated_probs(
    logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor
) -> torch.Tensor:
    """Probabilities with the cut tokens set to 0 (rows are not renormalised: the caller needs no sum of 1).

    logits: [R, V] float32, already divided by temperature.
    top_k: [R] int64, V where disabled.  top_p: [R] float32, 1.0 where disabled.  min_p: [R] float32, 0 where disabled.
    Order: min_p (relative to the most likely token, so it does not care about renormalising), then top_k, then
    top_p over the mass that top_k kept, as in HF and vLLM. The most likely token always survives.
    Returns probs: [R, V] float32.
    """
    vocab_size = logits.shape[1]
    probs = torch.softmax(logits, dim=-1)
    if bool((min_p > 0).any()):
        threshold = min_p[:, None] * probs.max(dim=-1, keepdim=True).values  # [R, 1]
        probs = probs.masked_fill(probs < threshold, 0.0)
    use_k = top_k < vocab_size
    use_p = top_p < 1.0
    if not bool((use_k | use_p).any()):
        return probs
    sorted_p, order = probs.sort(dim=-1, descending=True)  # [R, V] each
    rank = torch.arange(vocab_size, device=logits.device)[None, :]  # [1, V]
    sorted_p = sorted_p.masked_fill(rank >= top_k[:, None], 0.0)
    if bool(use_p.any()):
        kept = sorted_p.sum(dim=-1, keepdim=True)  # [R, 1]
        # Mass strictly before each token; a token is cut once that alone already reaches top_p.
        before = sorted_p.cumsum(dim=-1) - sorted_p
        cut = (before > top_p[:, None] * kept) & use_p[:, None]
        sorted_p = sorted_p.masked_fill(cut, 0.0)
    return torch.zeros_like(probs).scatter_(1, order, sorted_p)

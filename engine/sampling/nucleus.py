"""Top-p candidates without sorting the vocabulary: the shortest top-K prefix the nucleus fits in.

top_p (with top_k off) keeps tokens in descending order until the mass strictly before a token exceeds
top_p x the row's mass. So once the K most likely tokens hold more than top_p x mass, every later token is
cut and the race over those K candidates picks what the race over the whole sorted vocabulary would.
Per row, K = 64, then 4x larger until the nucleus fits (a sort of the row past V / 2). A whole-row sort
of [256, 32000] costs hundreds of milliseconds on a CPU, and the noise for all 32000 candidates more; here one
tempered-mass pass over the row and a top-64 usually do.

The mass of the whole row is returned because the top-p cut is relative to it, not to the candidates' sum.
It is summed in vocabulary order where the sort path summed in sorted order, so a token whose cumulative
mass lies within float rounding of the cut may fall the other way; the distribution is the same.
"""

from __future__ import annotations

import torch

from engine.sampling.topk import topk_rows

_FIRST_K = 64


def nucleus_candidates(
    logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """logits: [G, V] float32; temperature, top_p, min_p: [G, 1] float32.

    Returns (values [G, K] sorted descending, padded with -inf; ids [G, K] int64, padded with 0;
    mass [G, 1]: the sum over the whole row of the tempered weights exp((x - max) / T), min_p applied)."""
    rows, vocab = logits.shape
    top = logits.amax(dim=-1, keepdim=True)  # [G, 1]
    w = torch.exp((logits - top) / temperature)  # [G, V]: the weights race computes, max 1
    if bool((min_p > 0).any()):
        w = w.masked_fill(w < min_p, 0.0)
    mass = w.sum(dim=-1, keepdim=True)  # [G, 1]
    del w
    need = (top_p * mass)[:, 0]  # [G]
    found: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []  # (rows, values, ids) per round
    pending = torch.arange(rows, device=logits.device)
    k = _FIRST_K
    while len(pending):
        sub = logits[pending]
        if k > vocab // 2:
            values, ids = sub.sort(dim=-1, descending=True)
            found.append((pending, values, ids))
            break
        values, ids = topk_rows(sub, k)  # [P, k] sorted descending
        wk = torch.exp((values - top[pending]) / temperature[pending])
        wk = wk.masked_fill(wk < min_p[pending], 0.0)
        fits = wk.sum(dim=-1) > need[pending]  # the token after the k-th is cut
        found.append((pending[fits], values[fits], ids[fits]))
        pending = pending[~fits]
        k *= 4
    width = max(v.shape[1] for _, v, _ in found)
    out_values = torch.full((rows, width), -float("inf"), dtype=logits.dtype, device=logits.device)
    out_ids = torch.zeros((rows, width), dtype=torch.int64, device=logits.device)
    for where, values, ids in found:
        out_values[where, : values.shape[1]] = values
        out_ids[where, : ids.shape[1]] = ids
    return out_values, out_ids, mass

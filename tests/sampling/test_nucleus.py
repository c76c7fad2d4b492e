"""Top-p without a vocabulary sort (engine/sampling/nucleus.py): the race draws the tokens the sorted path drew."""

import numpy as np
import torch

import engine.sampling.race as race_module
from engine.sampling.race import race


def _sorted_whole_vocabulary(logits, temperature, top_p, min_p):
    """The path before: every token a candidate, sorted; top_p relative to the candidates' own mass."""
    values, ids = logits.sort(dim=-1, descending=True)
    return values, ids, None


def _logits(rows: int, seed: int, scale: float = 3.0) -> torch.Tensor:
    return torch.randn(rows, 32000, generator=torch.Generator().manual_seed(seed)) * scale


def _both(monkeypatch, logits, *args):
    new = race(logits, *args)
    with monkeypatch.context() as m:
        m.setattr(race_module, "nucleus_candidates", _sorted_whole_vocabulary)
        old = race(logits, *args)
    return new, old


def test_top_p_only_draws_the_same_tokens_as_sorting_the_vocabulary(monkeypatch):
    n = 24
    logits = _logits(n, seed=1)
    logits[:8] *= 3  # peaked rows: a small nucleus
    seeds = np.arange(1, n + 1, dtype=np.uint64) * np.uint64(104729)
    temperature = [0.7, 1.0, 1.3] * 8
    top_p = [0.5, 0.9, 0.95, 0.99] * 6
    min_p = [0.0] * 20 + [0.01] * 4
    new, old = _both(monkeypatch, logits, temperature, [32000] * n, top_p, min_p, seeds)
    assert new == old


def test_a_wide_nucleus_grows_until_it_fits(monkeypatch):
    """Flat rows: top_p 0.9 keeps most of the vocabulary, past 64 and 256 candidates, up to the sort."""
    logits = _logits(4, seed=2, scale=0.01)
    seeds = np.array([11, 12, 13, 14], dtype=np.uint64)
    args = ([1.0] * 4, [32000] * 4, [0.3, 0.6, 0.9, 0.999], [0.0] * 4, seeds)
    new, old = _both(monkeypatch, logits, *args)
    assert new == old


def test_a_row_draws_the_same_beside_a_row_with_a_wider_nucleus():
    peaked = _logits(1, seed=3) * 4
    flat = _logits(1, seed=4, scale=0.01)
    seeds = np.array([5, 6], dtype=np.uint64)
    alone = race(peaked, [0.8], [32000], [0.9], [0.0], seeds[:1])
    together = race(torch.cat([peaked, flat]), [0.8, 0.8], [32000] * 2, [0.9, 0.9], [0.0] * 2, seeds)
    assert together[0] == alone[0]

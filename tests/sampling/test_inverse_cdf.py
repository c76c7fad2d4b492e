"""Inverse-transform sampling for rows where every token is a candidate (engine/sampling/inverse_cdf.py)."""

import numpy as np
import torch

from engine.sampling.inverse_cdf import row_uniforms, sample_by_cdf
from engine.sampling.race import race


def test_frequencies_match_the_weights_and_zero_weights_never_win():
    # Seeded draws, so the outcome is fixed; the bound is ~5 standard deviations for n = 20,000.
    weights = torch.tensor([0.5, 0.0, 0.25, 1.0, 0.05, 0.0])
    n = 20_000
    tokens = sample_by_cdf(weights.expand(n, -1).contiguous(), np.arange(n, dtype=np.uint64))
    freq = torch.bincount(tokens, minlength=6).double() / n
    assert freq[1] == 0 and freq[5] == 0
    torch.testing.assert_close(freq, (weights / weights.sum()).double(), atol=0.015, rtol=0)


def test_uniforms_are_a_fixed_function_of_the_seed_in_unit_interval():
    seeds = np.array([0, 1, 2**63 - 1], dtype=np.uint64)
    u = row_uniforms(seeds)
    assert np.array_equal(u, row_uniforms(seeds.copy())) and ((u >= 0) & (u < 1)).all()
    assert len(set(u.tolist())) == 3


def test_a_seeded_row_draws_the_same_token_whatever_its_batch():
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(5, 32000, generator=gen) * 2
    seeds = np.array([3, 1, 4, 1, 5], dtype=np.uint64)
    together = race(logits, [0.9] * 5, [32000] * 5, [1.0] * 5, [0.0] * 5, seeds)
    alone = [race(logits[i : i + 1], [0.9], [32000], [1.0], [0.0], seeds[i : i + 1])[0] for i in range(5)]
    assert together == alone


def test_blocks_with_a_short_tail_and_empty_blocks():
    weights = torch.zeros(200)  # blocks of 64: [0, 64) empty, [64, 128), [128, 192) empty, tail [192, 200)
    weights[70], weights[100], weights[199] = 1.0, 2.0, 1.0
    n = 20_000
    tokens = sample_by_cdf(weights.expand(n, -1).contiguous(), np.arange(n, dtype=np.uint64) + 99, block=64)
    freq = torch.bincount(tokens, minlength=200).double() / n
    assert set(freq.nonzero().flatten().tolist()) == {70, 100, 199}
    torch.testing.assert_close(
        freq[[70, 100, 199]], torch.tensor([0.25, 0.5, 0.25]).double(), atol=0.015, rtol=0
    )

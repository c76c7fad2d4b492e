"""Block-threshold top-k (engine/sampling/topk.py) against torch.topk, and the race unchanged by it."""

import numpy as np
import pytest
import torch

import engine.sampling.race as race_module
from engine.sampling.race import race
from engine.sampling.topk import topk_rows


def _logits(rows: int, width: int, seed: int) -> torch.Tensor:
    return torch.randn(rows, width, generator=torch.Generator().manual_seed(seed)) * 3


@pytest.mark.parametrize("width", [4096, 4100, 5000])  # whole blocks, a short tail, a long tail
@pytest.mark.parametrize("k", [1, 7, 16])
def test_equals_torch_topk_on_distinct_values(width, k):
    x = _logits(33, width, seed=width + k)
    values, ids = topk_rows(x, k, block=64)
    ref = x.topk(k, dim=-1)
    assert torch.equal(values, ref.values)
    assert torch.equal(ids, ref.indices)


def test_row_sliced_view_of_padded_logits():
    """The sampler passes logits[:, :vocab]: rows not contiguous with each other."""
    padded = _logits(9, 4160, seed=1)
    x = padded[:, :4100]
    values, ids = topk_rows(x, 10, block=64)
    ref = x.topk(10, dim=-1)
    assert torch.equal(values, ref.values) and torch.equal(ids, ref.indices)


def test_values_in_one_block_and_a_low_rest():
    """All large values packed in a few blocks (the rest far below), as when most tokens are never likely."""
    x = torch.full((4, 4096), -20.0)
    x[:, 100:140] = _logits(4, 40, seed=2)
    x[:, 4000] = 9.0
    x[:, 3000:3010] = -19.0
    values, ids = topk_rows(x, 16, block=64)
    ref = x.topk(16, dim=-1)
    assert torch.equal(values, ref.values) and torch.equal(ids, ref.indices)


def test_ties_and_minus_infinity_give_the_same_values_and_valid_ids():
    gen = torch.Generator().manual_seed(3)
    x = torch.randint(-3, 3, (16, 4096), generator=gen).float()  # few distinct values: ties everywhere
    x[:8, 1000:] = -float("inf")  # masked tokens (a grammar mask)
    values, ids = topk_rows(x, 12, block=64)
    assert torch.equal(values, x.topk(12, dim=-1).values)
    assert torch.equal(x.gather(1, ids), values)
    assert all(len(set(row)) == 12 for row in ids.tolist())
    # Equal values are ordered by ascending id.
    for v, i in zip(values.tolist(), ids.tolist(), strict=True):
        assert [(-a, b) for a, b in zip(v, i, strict=True)] == sorted(
            (-a, b) for a, b in zip(v, i, strict=True)
        )


def test_narrow_rows_fall_back_to_torch():
    x = _logits(3, 300, seed=4)
    values, ids = topk_rows(x, 50, block=64)  # 4 blocks < 4 * k
    ref = x.topk(50, dim=-1)
    assert torch.equal(values, ref.values) and torch.equal(ids, ref.indices)


def test_seeded_race_draws_the_same_tokens_as_with_torch_topk(monkeypatch):
    """Same candidates in the same order -> the exponential race picks the same tokens for the same seeds."""
    x = _logits(48, 32000, seed=5)
    seeds = np.arange(1, 49, dtype=np.uint64) * np.uint64(7919)
    args = ([0.8] * 48, [50] * 24 + [5] * 24, [0.9] * 16 + [1.0] * 32, [0.0] * 40 + [0.05] * 8, seeds)
    new = race(x, *args)
    monkeypatch.setattr(race_module, "topk_rows", lambda t, k: t.topk(k, dim=-1))
    assert race(x, *args) == new


def test_a_row_mostly_tied_at_the_threshold():
    """Fewer large values than k: the rest of the top-k ties at -20 (any of those ids is a valid choice)."""
    x = torch.full((3, 4096), -20.0)
    x[:, 500:510] = _logits(3, 10, seed=6).abs() + 1
    values, ids = topk_rows(x, 16, block=64)
    assert torch.equal(values, x.topk(16, dim=-1).values)
    assert torch.equal(x.gather(1, ids), values)
    assert all(len(set(row)) == 16 for row in ids.tolist())


def test_candidates_hold_the_top_k_and_bound_the_rest():
    """topk_candidates: the top-k are among the candidates, every other value is <= bound."""
    from engine.sampling.topk import topk_candidates

    x = torch.randn(6, 32000, generator=torch.Generator().manual_seed(3))
    x[1, :64] = 9.0  # a block of equal large values
    x[2] = torch.linspace(-1, 1, 32000)  # sorted: the top-k in the last blocks
    for k in (1, 20, 60):
        values, ids, bound = topk_candidates(x, k)
        assert values.shape == ids.shape and values.shape[1] >= k
        assert np.array_equal(np.take_along_axis(x.numpy(), ids, 1), values)
        top = x.topk(k, dim=-1).values
        for r in range(x.shape[0]):
            assert np.sort(values[r])[::-1][:k].tolist() == top[r].tolist()
            outside = np.ones(x.shape[1], bool)
            outside[ids[r]] = False
            assert x[r].numpy()[outside].max() <= bound[r]

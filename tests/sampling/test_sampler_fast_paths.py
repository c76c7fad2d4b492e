"""The vectorised sampler: sparse penalties that leave the caller's logits intact, penalty state kept
between steps, top-k candidates instead of a sort, per-token noise."""

from __future__ import annotations

import numpy as np
import torch

from engine.sampling.host_sampler import Sampler
from engine.sampling.noise import exponential_noise
from engine.sampling.penalties import apply_penalties
from engine.sampling.race import race
from engine.sampling.request_rows import RequestRows
from tests.sampling.conftest import rows_of

V = 200
EOS = frozenset({0})


def _logits(batch: int, vocab: int = V, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, vocab, generator=torch.Generator().manual_seed(seed)) * 2


def test_sampling_with_penalties_leaves_logits_untouched(make_req):
    for padded in (V, V + 7):  # contiguous, and a column slice (padding vocab) of the input
        logits = _logits(3, padded)
        before = logits.clone()
        reqs = [
            make_req(output=[5, 6, 5], repetition_penalty=1.3, seed=1, top_k=10),
            make_req(output=[1], min_tokens=4, max_tokens=8, stop_token_ids=[7], temperature=0.5),
            make_req(output=[9], repetition_penalty=0.7, temperature=0.0),
        ]
        Sampler(V, EOS)(logits, reqs)
        assert torch.equal(logits, before)


def test_sparse_repetition_penalty_picks_what_the_dense_one_picks(make_req):
    """Greedy rows after the penalty: the sparse path against apply_penalties on a copy."""
    logits = _logits(8, seed=1)
    reqs = [
        make_req(
            prompt=list(range(i, 40 + i)), output=[i % 7], repetition_penalty=1.0 + 0.5 * i, temperature=0.0
        )
        for i in range(8)
    ]
    dense = apply_penalties(logits, rows_of(reqs, V))
    assert Sampler(V, EOS)(logits, reqs).token_ids == dense.argmax(-1).tolist()


def test_seen_tokens_follow_a_growing_request(make_req):
    batch = RequestRows(V)
    req = make_req(prompt=[3, 3, 4], output=[], repetition_penalty=1.2)
    for new in [4, 9, 250, 9, 11]:  # 250 is out of the vocab: ignored
        req.append_output_token(new)
        view = batch.sync([req])
        rows, cols = view.seen_index(np.array([0]))
        expected = sorted({t for t in req.token_ids() if t < V})
        assert rows.tolist() == [0] * len(cols)
        assert sorted(cols.tolist()) == expected
        probe = np.arange(V, dtype=np.int64)[None]
        assert np.flatnonzero(view.seen_contains(np.array([0]), probe)[0]).tolist() == expected
    other = make_req(prompt=[1], output=[], repetition_penalty=1.2)
    view = batch.sync([other])
    assert batch.ids == [other.request_id]  # requests absent from a step are forgotten
    assert view.seen_index(np.array([0]))[1].tolist() == [1]


def test_penalty_state_is_rebuilt_for_a_new_request_with_an_old_id(make_req):
    sampler = Sampler(V, EOS)
    logits = torch.zeros(1, V)
    logits[0, 5], logits[0, 6] = 3.0, 2.0
    first = make_req(output=[6], repetition_penalty=4.0, temperature=0.0)
    assert sampler(logits, [first]).token_ids == [5]
    again = make_req(output=[5], repetition_penalty=4.0, temperature=0.0)
    again.request_id = first.request_id  # same id, other tokens: 5 is now the penalised one
    assert sampler(logits, [again]).token_ids == [6]


def test_noise_depends_only_on_seed_and_token():
    seeds = torch.tensor([11, 12])
    ids = torch.tensor([[3, 4, 5], [3, 4, 5]])
    q = exponential_noise(seeds, ids)
    assert q.shape == (2, 3) and bool((q > 0).all()) and not torch.equal(q[0], q[1])
    shuffled = exponential_noise(seeds[:1], torch.tensor([[5, 3]]))
    assert shuffled[0].tolist() == [q[0, 2].item(), q[0, 0].item()]
    # Exp(1): mean 1 over many tokens.
    many = exponential_noise(torch.tensor([5]), torch.arange(200_000)[None])
    assert abs(many.mean().item() - 1.0) < 0.01


def test_row_token_does_not_depend_on_the_other_rows_top_k(make_req):
    """Rows are grouped by top_k: a row's draw is the same alone and beside rows of other groups."""
    sampler = Sampler(V, EOS)
    row = _logits(1, seed=5)
    target = dict(seed=3, top_k=20, top_p=0.9, temperature=0.8)
    alone = sampler(row, [make_req(output=[1], **target)]).token_ids[0]
    logits = torch.cat([_logits(1, seed=6), row, _logits(1, seed=7), _logits(1, seed=8)])
    others = [
        make_req(seed=1, top_k=5),
        make_req(output=[1], **target),
        make_req(seed=2),
        make_req(top_p=0.5),
    ]
    assert sampler(logits, others).token_ids[1] == alone


def test_top_k_candidates_sample_the_renormalised_distribution():
    """Frequencies over many seeded draws match softmax over the top-k (temperature applied)."""
    row = torch.tensor([4.0, 3.5, 3.0, 1.0, 0.0, -1.0])
    n = 20_000
    logits = row.expand(n, -1).contiguous()
    seeds = np.arange(n, dtype=np.uint64)
    tokens = race(logits, [0.7] * n, [3] * n, [1.0] * n, [0.0] * n, seeds)
    freq = torch.bincount(torch.tensor(tokens), minlength=6).float() / n
    expected = torch.softmax(row[:3] / 0.7, dim=-1)
    assert freq[3:].sum() == 0
    torch.testing.assert_close(freq[:3], expected, atol=0.015, rtol=0)

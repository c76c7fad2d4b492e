"""State the sampler keeps between steps (parameter arrays, seen tokens, the candidate width) must never
change a token: a sampler that lived through earlier steps picks what a fresh one picks, whatever happens
to the batch in between (requests leaving, ids reused, preemption, n > 1 siblings, rows reordered)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.sampling.host_sampler import Sampler
from engine.sampling.noise import row_seeds, stable_seed
from engine.sampling.penalised_topk import SeenPenalty
from engine.sampling.request_rows import RequestRows
from engine.sampling.topk import topk_rows
from tests.sampling.conftest import rows_of

V = 300
EOS = frozenset({0})


def _logits(rows: int, step: int) -> torch.Tensor:
    """[rows, V]: a few hot tokens (low ids, as in BPE vocabularies) that requests keep sampling."""
    x = torch.randn(rows, V, generator=torch.Generator().manual_seed(1000 + step))
    x[:, 1:40] += 4.0
    return x


def _check_step(sampler: Sampler, reqs: list, step: int) -> list[int]:
    logits = _logits(len(reqs), step)
    before = logits.clone()
    got = sampler(logits, reqs).token_ids
    assert torch.equal(logits, before)
    assert got == Sampler(V, EOS)(logits, reqs).token_ids, f"step {step}"
    return got


def _grow(reqs: list, tokens: list[int]) -> None:
    for r, t in zip(reqs, tokens, strict=True):
        r.append_output_token(t)


def test_kept_state_picks_what_a_fresh_sampler_picks(make_req):
    topk = dict(temperature=0.9, top_k=20, top_p=0.95)
    a = make_req(prompt=list(range(1, 30)), seed=1, repetition_penalty=1.8, **topk)
    b = make_req(prompt=[5, 6, 7], temperature=0.0, repetition_penalty=1.5)  # greedy: sparse edits
    c = make_req(prompt=[8, 9], seed=3, top_p=0.8, repetition_penalty=1.3)  # top-p only: sparse edits
    d = make_req(prompt=[2, 3], seed=4, repetition_penalty=0.8, **topk)  # r < 1: the exact path
    # n = 2 siblings: one seed, one group, two sample indices.
    s0 = make_req(prompt=[1, 2], seed=9, sample_index=0, repetition_penalty=2.0, **topk)
    s1 = make_req(prompt=[1, 2], seed=9, sample_index=1, repetition_penalty=2.0, **topk)
    s1.group_id = s0.group_id
    e = make_req(prompt=[4], seed=5, min_tokens=3, max_tokens=10, repetition_penalty=1.2, **topk)
    sampler = Sampler(V, EOS)
    reqs = [a, b, c, d, s0, s1, e]
    step = 0
    for _ in range(4):
        _grow(reqs, _check_step(sampler, reqs, step))
        step += 1
    # b leaves; a new request reuses its id with another history; the rest are reordered.
    b2 = make_req(prompt=list(range(40, 60)), temperature=0.7, top_k=10, seed=7, repetition_penalty=3.0)
    b2.request_id = b.request_id
    reqs = [e, b2, s1, a, d, s0, c]
    for _ in range(3):
        _grow(reqs, _check_step(sampler, reqs, step))
        step += 1
    # a is preempted (absent for a step, output kept), then recomputed and back.
    rest = [r for r in reqs if r is not a]
    _grow(rest, _check_step(sampler, rest, step))
    step += 1
    for _ in range(2):
        _grow(reqs, _check_step(sampler, reqs, step))
        step += 1
    # d loses its output (preempted and restarted without it): the same object with fewer tokens.
    del d.output_token_ids[:]
    d._token_ids = None
    for _ in range(2):
        _grow(reqs, _check_step(sampler, reqs, step))
        step += 1


def test_seen_tokens_start_over_for_a_new_history(make_req):
    """A new request under an old id (even with a longer history), and a request whose tokens went
    down (preempted, output dropped), are re-read from scratch."""
    batch = RequestRows(V)
    zero = np.array([0])
    old = make_req(prompt=[1, 2], output=[3], repetition_penalty=1.5)
    batch.sync([old])
    new = make_req(prompt=list(range(10, 20)), repetition_penalty=1.5)  # longer than `old`'s history
    new.request_id = old.request_id
    assert sorted(batch.sync([new]).seen_index(zero)[1].tolist()) == list(range(10, 20))
    new.append_output_token(25)
    batch.sync([new])
    del new.output_token_ids[:]
    new._token_ids = None
    new.prompt_token_ids = list(range(10, 19))  # fewer tokens than its row: another history
    view = batch.sync([new])
    assert view.seen_index(zero)[1].tolist() == list(range(10, 19))
    assert np.flatnonzero(view.seen_contains(zero, np.arange(V)[None])[0]).tolist() == list(range(10, 19))


def test_penalty_applies_to_tokens_seen_since_the_last_step(make_req):
    """A token sampled last step is penalised this step (the kept seen set grows)."""
    sampler = Sampler(V, EOS)
    req = make_req(prompt=[7], temperature=1.0, top_k=2, repetition_penalty=100.0, seed=0)
    logits = torch.full((1, V), -5.0)
    logits[0, 20], logits[0, 21] = 30.0, 29.0  # 20 is near-certain unless penalised
    first = sampler(logits, [req]).token_ids[0]
    assert first == 20
    req.append_output_token(first)
    assert sampler(logits, [req]).token_ids[0] == 21


def test_min_tokens_progress_is_read_every_step(make_req):
    """A greedy request with min_tokens: EOS banned until its output is long enough, then plain argmax."""
    sampler = Sampler(V, EOS)
    req = make_req(prompt=[3], temperature=0.0, min_tokens=2, max_tokens=5)
    logits = torch.zeros(1, V)
    logits[0, 0], logits[0, 4] = 5.0, 1.0  # EOS is the argmax
    for expected in (4, 4, 0):
        token = sampler(logits, [req]).token_ids[0]
        assert token == expected
        req.append_output_token(token)


def test_rows_follow_the_requests_given(make_req):
    """A row per request: kept for the same object, made anew for another object under its id, dropped
    when the request is absent; the rows stay dense (0..n-1) through removals."""
    batch = RequestRows(V, EOS)
    reqs = [make_req(seed=1), make_req(seed=2), make_req(seed=3)]
    view = batch.sync(reqs)
    assert view.rows.tolist() == [0, 1, 2]
    assert batch.sync(reqs[::-1]).rows.tolist() == [2, 1, 0]
    swapped = batch.sync([reqs[2], make_req(seed=4)])
    assert sorted(swapped.rows.tolist()) == [0, 1] and len(batch) == 2
    assert swapped.seeds_input()[0].tolist() == [3, 4]


def _penalised_reference(x: torch.Tensor, seen: list[np.ndarray], factor: np.ndarray, k: int):
    dense = x.clone()
    for i, ids in enumerate(seen):
        v = dense[i, ids]
        dense[i, ids] = torch.where(v > 0, v / float(factor[i]), v * float(factor[i]))
    return topk_rows(dense, k)


@pytest.mark.parametrize("vocab", [2_000, 40_000])  # torch topk candidates (V < 256 k), and blocks
def test_penalised_topk_is_exact(make_req, monkeypatch, vocab):
    """Rows with few and many seen top tokens, r above and below 1, and a row without penalty."""
    gen = torch.Generator().manual_seed(0)
    rows, k = 8, 20
    x = torch.randn(rows, vocab, generator=gen) * 2
    order = x.argsort(dim=-1, descending=True)
    seen_ids = [
        order[0, 5:200:7],  # a few of the top tokens
        order[1, :60],  # the whole top: the fit test fails, the exact path runs
        order[2, :30:2],
        torch.randint(0, vocab, (500,), generator=gen),  # spread over the vocabulary
        order[4, :40],
        order[5, :10],
        order[6, :40],
        order[7, :5],
    ]
    factor = np.array([1.3, 4.0, 1.1, 2.0, 0.5, 1.0, 1.0, 0.9], dtype=np.float32)
    reqs = [
        make_req(prompt=sorted(set(ids.tolist())), temperature=1.0, repetition_penalty=float(f))
        for ids, f in zip(seen_ids, factor, strict=True)
    ]
    seen = rows_of(reqs, vocab)
    exact_rows: list[int] = []
    copy = SeenPenalty._penalised_copy

    def spy(self, x, rows, which):
        exact_rows.extend(which.tolist())
        return copy(self, x, rows, which)

    monkeypatch.setattr(SeenPenalty, "_penalised_copy", spy)
    penalty = SeenPenalty(seen, np.arange(rows), factor, extra=16)
    values, ids = penalty.topk(x, np.arange(rows), k)
    ref_values, ref_ids = _penalised_reference(x, [np.unique(s.numpy()) for s in seen_ids], factor, k)
    assert torch.equal(ids, ref_ids) and torch.equal(values, ref_values)
    assert 1 in exact_rows and 4 in exact_rows and 7 in exact_rows  # missed; r < 1 twice
    assert 0 not in exact_rows and 5 not in exact_rows  # fit among the candidates
    assert penalty.extra >= 24  # a row missed: the next step looks wider


def test_vectorised_row_seeds_match_the_scalar_hash(make_req):
    reqs = [make_req(output=[1] * p, seed=s, sample_index=i) for p, s, i in [(0, 1, 0), (3, 1, 0), (3, 1, 2)]]
    seeds = row_seeds(*rows_of(reqs, V).seeds_input())
    assert seeds.tolist() == [
        stable_seed(1, 0, 0),
        stable_seed(1, 0, 3),
        stable_seed(1, 2, 3),
    ]
    seeded = np.array([True, False])
    out = row_seeds(np.array([5, 0], np.uint64), seeded, np.zeros(2, np.uint64), np.array([4, 4]))
    assert out[0].item() == stable_seed(5, 0, 4) and out[1].item() < 2**63

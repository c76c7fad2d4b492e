"""Greedy, truncation (top_k / top_p / min_p), temperature statistics, logprobs."""

from __future__ import annotations

import pytest
import torch

from engine.sampling.host_sampler import Sampler

V = 50
EOS = frozenset({0})


def _logits(batch: int, vocab: int = V, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, vocab, generator=gen) * 3  # [B, V] float32


def test_greedy_is_argmax_and_ignores_padding_columns(make_req):
    logits = _logits(6, V + 14)
    logits[:, V:] = 100.0  # padding beyond the tokenizer vocab must never win
    reqs = [make_req(temperature=0.0) for _ in range(6)]
    state = torch.get_rng_state()
    result = Sampler(V, EOS)(logits, reqs)
    assert result.token_ids == logits[:, :V].argmax(-1).tolist()
    assert result.logprobs == [None] * 6
    assert torch.equal(state, torch.get_rng_state())  # fast path draws no random numbers


def test_greedy_rows_in_mixed_batch_are_argmax(make_req):
    logits = _logits(4)
    reqs = [make_req(temperature=0.0), make_req(temperature=1.0, seed=1)] * 2
    tokens = Sampler(V, EOS)(logits, reqs).token_ids
    assert tokens[0::2] == logits[0::2].argmax(-1).tolist()


@pytest.mark.parametrize("params", [dict(top_k=1), dict(top_p=1e-6), dict(min_p=1.0)])
def test_truncation_to_one_token_is_greedy(make_req, params):
    logits = _logits(16, seed=3)
    reqs = [make_req(temperature=1.5, seed=s, **params) for s in range(16)]
    assert Sampler(V, EOS)(logits, reqs).token_ids == logits.argmax(-1).tolist()


def _frequencies(make_req, logits_row: torch.Tensor, n: int, **params) -> torch.Tensor:
    """Sample n seeded rows of the same logits in one batch; return the empirical distribution [V]."""
    logits = logits_row.expand(n, -1).clone()
    reqs = [make_req(seed=s, **params) for s in range(n)]
    tokens = torch.tensor(Sampler(logits.shape[1], EOS)(logits, reqs).token_ids)
    return torch.bincount(tokens, minlength=logits.shape[1]).float() / n


def test_top_k_and_top_p_keep_exactly_the_expected_support(make_req):
    probs = torch.tensor([0.05, 0.4, 0.25, 0.2, 0.1])
    row = probs.log()
    assert set(_frequencies(make_req, row, 400, top_k=2).nonzero().flatten().tolist()) == {1, 2}
    # Cumulative mass before token 3 is 0.65 < 0.7, before token 4 it is 0.85: keep {1, 2, 3}.
    assert set(_frequencies(make_req, row, 400, top_p=0.7).nonzero().flatten().tolist()) == {1, 2, 3}
    # top_p applies to what top_k kept: of {1, 2, 3} renormalised (0.47, 0.29, 0.24), 0.5 keeps {1, 2}.
    kept = _frequencies(make_req, row, 400, top_k=3, top_p=0.5).nonzero().flatten().tolist()
    assert set(kept) == {1, 2}


def test_min_p_cuts_tokens_below_fraction_of_max(make_req):
    probs = torch.tensor([0.05, 0.4, 0.25, 0.19, 0.11])
    freq = _frequencies(make_req, probs.log(), 500, min_p=0.3)  # threshold 0.12
    assert set(freq.nonzero().flatten().tolist()) == {1, 2, 3}


@pytest.mark.parametrize("temperature", [1.0, 0.5, 2.0])
def test_temperature_sampling_matches_softmax(make_req, temperature):
    # Seeded, so the outcome is fixed; the bound is ~5 standard deviations for n = 4000.
    row = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    freq = _frequencies(make_req, row, 4000, temperature=temperature)
    expected = torch.softmax(row / temperature, dim=-1)
    assert (freq - expected).abs().max().item() < 0.04


def test_unseeded_sampling_follows_distribution(make_req):
    torch.manual_seed(1234)
    row = torch.tensor([1.0, 0.0, -1.0])
    n = 3000
    logits = row.expand(n, -1).clone()
    tokens = torch.tensor(Sampler(3, EOS)(logits, [make_req() for _ in range(n)]).token_ids)
    freq = torch.bincount(tokens, minlength=3).float() / n
    assert (freq - torch.softmax(row, -1)).abs().max().item() < 0.05


def test_logprobs_sampled_first_then_top_k_of_raw_logits(make_req):
    logits = _logits(4, V + 6, seed=5)
    reqs = [
        make_req(temperature=0.0, logprobs=3),
        make_req(temperature=0.7, seed=9, logprobs=0, repetition_penalty=1.7, output=[1, 2]),
        make_req(temperature=1.0, seed=2),
        make_req(temperature=1.0, seed=2, logprobs=20, top_k=5),
    ]
    result = Sampler(V, EOS)(logits, reqs)
    raw = torch.log_softmax(logits[:, :V], dim=-1)
    assert result.logprobs[2] is None
    for i, k in [(0, 3), (1, 0), (3, 20)]:
        entry = result.logprobs[i]
        assert len(entry) == 1 + k
        assert entry[0][0] == result.token_ids[i]
        assert entry[0][1] == pytest.approx(raw[i, result.token_ids[i]].item(), abs=1e-6)
        top = raw[i].topk(k) if k else None
        if top is not None:
            assert [t for t, _ in entry[1:]] == top.indices.tolist()
            assert [lp for _, lp in entry[1:]] == pytest.approx(top.values.tolist(), abs=1e-6)
    # Greedy: the sampled token is the top-1.
    assert result.logprobs[0][0] == result.logprobs[0][1]


def test_rejects_logits_that_do_not_fit(make_req):
    with pytest.raises(ValueError):
        Sampler(V, EOS)(torch.zeros(2, V - 1), [make_req(), make_req()])

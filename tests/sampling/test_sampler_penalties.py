"""Penalties and min_tokens against hand-computed logits."""

from __future__ import annotations

import torch

from engine.sampling.host_sampler import Sampler
from engine.sampling.penalties import apply_bans, apply_penalties
from tests.sampling.conftest import rows_of

EOS = frozenset({0})


def test_repetition_penalty_divides_positive_and_multiplies_negative(make_req):
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, -2.0]])
    logits = apply_penalties(
        logits, rows_of([make_req(prompt=[0], output=[1, 1], repetition_penalty=2.0)], logits.shape[1])
    )
    assert logits.tolist() == [[1.0, -2.0, 0.5, 3.0, -2.0]]


def test_presence_and_frequency_count_output_tokens_only(make_req):
    logits = torch.zeros(1, 5)
    req = make_req(prompt=[4, 4], output=[1, 1, 2], presence_penalty=1.0, frequency_penalty=0.5)
    logits = apply_penalties(logits, rows_of([req], logits.shape[1]))
    # token 1: 0.5*2 + 1 = 2; token 2: 0.5*1 + 1 = 1.5; prompt token 4 untouched.
    assert logits.tolist() == [[0.0, -2.0, -1.5, 0.0, 0.0]]


def test_negative_presence_and_frequency_encourage(make_req):
    logits = torch.zeros(1, 3)
    logits = apply_penalties(
        logits,
        rows_of([make_req(output=[2], presence_penalty=-1.0, frequency_penalty=-0.25)], logits.shape[1]),
    )
    assert logits.tolist() == [[0.0, 0.0, 1.25]]


def test_penalties_are_per_row(make_req):
    logits = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 1.0]])
    reqs = [
        make_req(output=[0], repetition_penalty=4.0),
        make_req(output=[0]),
        make_req(output=[1, 1], frequency_penalty=1.0),
    ]
    logits = apply_penalties(logits, rows_of(reqs, logits.shape[1]))
    assert logits.tolist() == [[0.25, 1.0], [1.0, 1.0], [1.0, -1.0]]


def test_penalty_changes_greedy_choice(make_req):
    logits = torch.tensor([[0.0, 2.0, 1.5]])
    sampler = Sampler(3, EOS)
    assert sampler(logits, [make_req(temperature=0.0, output=[1])]).token_ids == [1]
    assert sampler(logits, [make_req(temperature=0.0, output=[1], repetition_penalty=2.0)]).token_ids == [2]
    assert logits.tolist() == [[0.0, 2.0, 1.5]]  # the caller's logits are not modified


def test_min_tokens_masks_eos_and_stop_token_ids(make_req):
    logits = torch.tensor([[9.0, 8.0, 7.0, 1.0]])
    sampler = Sampler(4, EOS)
    params = dict(temperature=0.0, min_tokens=2, max_tokens=5, stop_token_ids=[1])
    assert sampler(logits, [make_req(output=[3], **params)]).token_ids == [2]
    assert sampler(logits, [make_req(output=[3, 3], **params)]).token_ids == [0]
    # ignore_eos: EOS is not masked (the engine does not stop on it), stop_token_ids still are.
    reqs = [make_req(output=[], ignore_eos=True, **params)]
    assert sampler(logits, reqs).token_ids == [0]
    masked = logits.clone()
    apply_bans(masked, *rows_of(reqs, 4, EOS).banned())
    assert masked[0, 1].item() == float("-inf") and masked[0, 0].item() == 9.0


def test_min_tokens_with_sampling_never_picks_banned(make_req):
    logits = torch.zeros(64, 3)
    logits[:, 0] = 5.0
    reqs = [make_req(seed=s, min_tokens=1) for s in range(64)]
    assert 0 not in Sampler(3, EOS)(logits, reqs).token_ids


def test_empty_history_and_out_of_range_ids_are_harmless(make_req):
    logits = torch.ones(2, 3)
    reqs = [
        make_req(output=[], frequency_penalty=1.0),
        make_req(prompt=[7], output=[9, 2], repetition_penalty=2.0),
    ]
    logits = apply_penalties(logits, rows_of(reqs, logits.shape[1]))
    assert logits.tolist() == [[1.0, 1.0, 1.0], [1.0, 1.0, 0.5]]


def test_all_greedy_batch_still_bans_eos_before_min_tokens(make_req):
    """An all-greedy batch without penalties is one argmax, except rows still under min_tokens."""
    logits = torch.tensor([[5.0, 1.0, 2.0], [5.0, 1.0, 2.0]])  # EOS (0) is the argmax of both rows
    reqs = [
        make_req(temperature=0.0, min_tokens=2, output=[1]),
        make_req(temperature=0.0, min_tokens=2, output=[1, 1]),
    ]
    assert Sampler(3, EOS)(logits, reqs).token_ids == [2, 0]
    assert logits[0, 0] == 5.0  # the caller's logits are put back

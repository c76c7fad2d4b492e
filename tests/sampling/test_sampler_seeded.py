"""A seeded request's token depends only on (seed, sample_index, position) and its own logits."""

from __future__ import annotations

import torch

from engine.sampling.host_sampler import Sampler
from engine.sampling.noise import stable_seed

V = 1000
EOS = frozenset({0})


def _row(seed: int) -> torch.Tensor:
    return torch.randn(V, generator=torch.Generator().manual_seed(seed))  # [V] float32; flat-ish distribution


def test_stable_seed_is_a_fixed_function():
    assert stable_seed(1, 0, 0) == stable_seed(1, 0, 0)
    assert len({stable_seed(1, 0, 0), stable_seed(1, 1, 0), stable_seed(1, 0, 1), stable_seed(2, 0, 0)}) == 4
    assert 0 <= stable_seed(2**63 - 1, 63, 10**6) < 2**63


def test_same_token_whatever_the_batch(make_req):
    sampler = Sampler(V, EOS)
    target = dict(seed=42, temperature=1.0, top_p=0.95)
    alone = sampler(_row(0)[None], [make_req(output=[5, 6], **target)]).token_ids[0]
    for other in range(5):
        torch.manual_seed(other)
        others = [make_req(seed=other * 10 + j) for j in range(other)] + [make_req() for _ in range(other)]
        reqs = others[: other // 2] + [make_req(output=[5, 6], **target)] + others[other // 2 :]
        logits = torch.stack([_row(100 + j) for j in range(len(reqs))])
        logits[other // 2] = _row(0)
        assert sampler(logits, reqs).token_ids[other // 2] == alone


def test_depends_on_position_not_on_request_identity(make_req):
    sampler = Sampler(V, EOS)
    logits = _row(1)[None]
    # Different prompt, request id and output tokens, same length: same token (a resumed request continues).
    a = sampler(logits, [make_req(prompt=[1, 2, 3], output=[7, 8, 9], seed=7)]).token_ids
    b = sampler(logits, [make_req(prompt=[4], output=[1, 1, 1], seed=7)]).token_ids
    assert a == b
    # Over positions and sample indices the draws differ (1000 near-uniform tokens: collisions are rare).
    by_position = {sampler(logits, [make_req(output=[1] * p, seed=7)]).token_ids[0] for p in range(20)}
    by_sample = {sampler(logits, [make_req(seed=7, sample_index=i)]).token_ids[0] for i in range(20)}
    assert len(by_position) > 10 and len(by_sample) > 10


def test_generation_replays_after_a_crash(make_req):
    """Generate 12 tokens; restart from token 5 in a different batch: the rest is identical."""
    sampler = Sampler(V, EOS)

    def logits_for(output: list[int]) -> torch.Tensor:
        return _row(sum(output) + len(output))  # a deterministic stand-in for the model

    out: list[int] = []
    for _ in range(12):
        out += sampler(logits_for(out)[None], [make_req(output=out, seed=3, sample_index=1)]).token_ids
    resumed = out[:5]
    while len(resumed) < 12:
        reqs = [make_req(seed=99), make_req(output=resumed, seed=3, sample_index=1), make_req()]
        logits = torch.stack([_row(5), logits_for(resumed), _row(6)])
        resumed += [sampler(logits, reqs).token_ids[1]]
    assert resumed == out

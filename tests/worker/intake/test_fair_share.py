"""Fair share counts tokens, not jobs (intake/fair_share.py), with plain ints: tenants whose jobs differ in
size get equal tokens at equal weights, so the tenant of small jobs gets more jobs."""

from __future__ import annotations

import pytest

from worker.intake.fair_share import FairShare


@pytest.mark.parametrize("weights", [(1.0, 1.0), (1.0, 3.0)])
def test_tokens_not_jobs_split_by_the_weights(weights):
    policy = FairShare(list(weights), patience=100)
    cost = [30, 10]  # tokens per job: lane 0's jobs are three times lane 1's
    jobs, tokens = [0, 0], [0, 0]
    for _ in range(400):
        for k, share in enumerate(policy.shares(4)):
            if share:
                policy.read_back(k, share, share)  # both lanes backlogged: every read comes back full
                jobs[k] += share
                tokens[k] += cost[k] * share
                policy.charge(k, cost[k] * share)
    assert abs(tokens[1] / tokens[0] / (weights[1] / weights[0]) - 1) <= 0.1, tokens
    assert abs(jobs[1] / jobs[0] / (3 * weights[1] / weights[0]) - 1) <= 0.1, jobs


def test_idle_lanes_take_at_most_every_other_single_free_slot():
    """One slot frees at a time (room 1) while one tenant has a backlog and two lanes are idle: probing
    the idle lanes may delay the backlogged one by a round every other round, never every round."""
    policy = FairShare([1.0, 1.0, 1.0], patience=100)
    backlog = [0, 10**6, 0]
    served = 0
    for _ in range(100):
        shares = policy.shares(1)
        for k, share in enumerate(shares):
            if share:
                got = min(share, backlog[k])
                policy.read_back(k, share, got)
                backlog[k] -= got
                served += got if k == 1 else 0
    assert served >= 47, served  # (the first rounds find out which lanes are idle)

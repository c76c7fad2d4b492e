"""Priority lanes with plain ints (intake/priority_lanes.py): short levels above a backlog are probed
without holding the backlog back round after round."""

from __future__ import annotations

from worker.intake.priority_lanes import PriorityLanes


def test_short_levels_take_at_most_every_other_single_free_slot():
    policy = PriorityLanes(3, patience=100)
    backlog = [0, 0, 10**6]  # levels 0 and 1 drained, level 2 has a backlog
    served = 0
    for _ in range(100):
        for k, share in enumerate(policy.shares(1)):
            if share:
                got = min(share, backlog[k])
                policy.read_back(k, share, got)
                backlog[k] -= got
                served += got if k == 2 else 0
    assert served >= 47, served  # (the first rounds find out which lanes are idle)

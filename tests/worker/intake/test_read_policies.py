"""Read policies over lanes, with plain ints: the contract on ReadPolicy, and each policy's own order."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.intake.fair_share import FairShare
from worker.intake.home_first import HomeFirst
from worker.intake.priority_lanes import PriorityLanes
from worker.intake.read_policy import OneLane, ReadPolicy
from worker.intake.read_shares import ReadShares


def feed(policy: ReadPolicy, shares: list[int], backlog: list[int]) -> list[int]:
    """Each lane's read takes min(share, backlog) entries; returns what each got."""
    got = [min(s, b) for s, b in zip(shares, backlog, strict=True)]
    for k, share in enumerate(shares):
        if share:
            policy.read_back(k, share, got[k])
            backlog[k] -= got[k]
    return got


# ---- the contract -----------------------------------------------------------------------------------
POLICIES = {
    "one": lambda n: OneLane(),
    "priority": lambda n: PriorityLanes(n, patience=3),
    "fair": lambda n: FairShare([1.0 + k for k in range(n)], patience=3),
    "home": lambda n: HomeFirst(n, {0}, patience=3),
    "no home": lambda n: HomeFirst(n, set(), patience=3),
    "shares": lambda n: ReadShares(n),
}


@pytest.mark.parametrize("name", POLICIES)
@settings(max_examples=60, deadline=None)
@given(
    lanes=st.integers(1, 5),
    rounds=st.lists(st.integers(0, 12), min_size=1, max_size=40),
)
def test_never_more_than_the_room_and_every_waiting_lane_is_read(name, lanes, rounds):
    policy = POLICIES[name](lanes)
    n = policy.lanes
    backlog = [10**6] * n  # every lane always has entries waiting
    since = [0] * n  # rounds with room since the lane was last given a share
    for room in rounds:
        shares = policy.shares(room, first=room % n)
        assert len(shares) == n and min(shares) >= 0 and max(shares) <= max(room, 0)
        assert sum(shares) <= room
        feed(policy, shares, backlog)
        for k in range(n):
            since[k] = 0 if shares[k] or room <= 0 else since[k] + 1
        if name == "home":  # HomeFirst leaves a busy home's other lanes to their owners (home_first.py)
            since = [since[0]] + [0] * (n - 1)
        # bound: patience + lanes for aged policies; a turn per other lane for ReadShares, at most n
        # quotas of the largest room seen (12) in rounds of at least one
        bound = 3 + n if name != "shares" else n * 12 + n
        assert max(since) <= bound, (shares, since)


def test_a_policy_that_offers_more_than_the_room_is_caught():
    class Greedy(ReadPolicy):
        def split(self, room: int, first: int) -> list[int]:
            return [room + 1]

    with pytest.raises(AssertionError, match="breaks its contract"):
        Greedy(1).shares(4)
    assert Greedy(1).shares(0) == [0]  # no room: nothing is asked of the policy


def test_oldest_first_across_lanes_is_the_longest_wait():
    policy = PriorityLanes(3, patience=100)
    policy.waited = [2, 5, 5]
    assert policy.by_wait([0, 1, 2]) == [1, 2, 0]


# ---- one stream ---------------------------------------------------------------------------------------
def test_one_lane_takes_all_the_room():
    assert OneLane().shares(7) == [7] and OneLane().shares(0) == [0]


# ---- priority lanes -----------------------------------------------------------------------------------
def test_priority_lanes_read_the_highest_level_with_work_first():
    policy = PriorityLanes(3, patience=100)
    assert policy.shares(8) == [8, 0, 0]  # unknown lanes are read as if full
    policy.read_back(0, asked=8, got=2)  # level 0 drained
    assert policy.shares(8) == [1, 7, 0]  # probed with one; level 1 takes the rest
    policy.read_back(0, asked=1, got=1)  # new work at level 0: it takes the room again
    assert policy.shares(8) == [8, 0, 0]


def test_a_job_of_priority_0_behind_a_flood_of_priority_10_is_read_first():
    """Issue 23's case: eight jobs of priority 10 queued first, then one of priority 0, room for one."""
    policy = PriorityLanes(2, patience=100)
    backlog = [0, 8]  # lane 0: priority 0, lane 1: priority 10
    order = []
    for step in range(24):
        if step == 1:
            backlog[0] += 1  # the urgent job arrives after the flood started
        got = feed(policy, policy.shares(1), backlog)
        order += [k for k, g in enumerate(got) for _ in range(g)]
    assert order.index(0) <= 2 and order.count(1) == 8  # read within two rounds of arriving


def test_a_low_level_below_a_flood_still_moves():
    policy = PriorityLanes(2, patience=4)
    backlog = [10**6, 10**6]
    got = [0, 0]
    for _ in range(50):
        for k, g in enumerate(feed(policy, policy.shares(2), backlog)):
            got[k] += g
    assert got[1] >= 50 // 5 and got[0] > got[1]


# ---- weighted fair share ------------------------------------------------------------------------------
def test_fair_share_serves_tokens_in_proportion_to_the_weights():
    policy = FairShare([3.0, 1.0], patience=100)
    backlog = [10**6, 10**6]
    served = [0, 0]
    for _ in range(400):
        for k, g in enumerate(feed(policy, policy.shares(4), backlog)):
            cost = 10 * g  # every job costs 10 tokens
            policy.charge(k, cost)
            served[k] += cost
    assert abs(served[0] / served[1] - 3.0) < 0.15, served


def test_a_flood_cannot_delay_another_tenants_jobs():
    """Tenant A has 200 jobs queued; tenant B's 20 arrive later: B is read within two rounds, and from
    then on gets its share (half, equal weights), not what A's backlog leaves."""
    policy = FairShare([1.0, 1.0], patience=100, job_cost=10)  # every job costs 10 tokens
    backlog = [200, 0]
    for _ in range(10):  # A alone: A accumulates service
        for k, g in enumerate(feed(policy, policy.shares(4), backlog)):
            policy.charge(k, 10 * g)
    backlog[1] = 20
    b_per_round = []
    for _ in range(8):
        got = feed(policy, policy.shares(4), backlog)
        for k, g in enumerate(got):
            policy.charge(k, 10 * g)
        b_per_round.append(got[1])
    first = next(i for i, g in enumerate(b_per_round) if g)
    after = b_per_round[first + 1 :]
    assert first <= 1 and abs(sum(after) - 2 * len(after)) <= 3, b_per_round


def test_a_lane_backlogged_again_banks_no_credit():
    policy = FairShare([1.0, 1.0], patience=100)
    policy.hungry = [True, False]
    policy.counter = [500.0, 0.0]  # lane 1 idle all along
    policy.read_back(1, asked=1, got=1)
    assert policy.counter[1] == 500.0  # starts level with the backlogged lane, not 500 tokens ahead


# ---- home lanes and stealing --------------------------------------------------------------------------
def test_home_lanes_first_and_stealing_only_when_home_lanes_are_short():
    policy = HomeFirst(3, {0, 1}, patience=100)
    policy.hungry = [False, True, True]
    assert policy.shares(6) == [0, 6, 0]  # home lane 1 has work: no stealing
    policy.read_back(1, asked=6, got=3)  # drained
    assert policy.shares(6) == [6, 0, 0]  # home lane 0, not read since home had work, is read first
    policy.read_back(0, asked=6, got=0)  # every home lane found empty: now the worker steals
    assert policy.shares(6) == [1, 1, 4]  # home lanes probed, the rest stolen from lane 2
    policy.hungry = [False, False, False]
    assert policy.shares(6) in ([6, 0, 0], [0, 6, 0])  # short queues: one home lane reads it all


def test_no_stealing_while_home_has_work_and_only_from_stealable_lanes():
    policy = HomeFirst(3, {0}, patience=2)
    backlog = [10**6, 10**6, 10**6]  # the home lane never runs dry
    got = [0, 0, 0]
    for _ in range(30):
        for k, g in enumerate(feed(policy, policy.shares(3), backlog)):
            got[k] += g
    assert got[1] == got[2] == 0  # not even patience's one-entry probes
    policy.stealable = {2}  # lane 1's owner has room, lane 2's has none (or left)
    backlog[0] = 0
    for _ in range(30):
        for k, g in enumerate(feed(policy, policy.shares(3), backlog)):
            got[k] += g
    assert got[1] == 0 and got[2] > 30
    assert [policy.idle_cap(k) for k in range(3)] == [None, 0, 1]


def test_home_lanes_move_at_run_time_and_reads_are_counted_as_home_or_stolen():
    policy = HomeFirst(3, {0}, patience=100)
    policy.read_back(0, asked=4, got=0)
    policy.hungry = [False, True, False]
    assert policy.shares(4) == [1, 3, 0]  # home lane 0 probed, lane 1 stolen from
    policy.read_back(0, asked=1, got=0)
    policy.read_back(1, asked=3, got=3)
    assert (policy.from_home, policy.stolen) == (0, 3)
    assert policy.move_home({1}) and not policy.move_home({1})
    assert policy.shares(4) == [0, 4, 0]  # lane 1 is home now, and hungry
    policy.read_back(1, asked=4, got=2)
    assert (policy.from_home, policy.stolen) == (2, 3)
    with pytest.raises(ValueError):
        policy.move_home({3})


def test_stealing_sticks_to_one_lane_while_it_has_more():
    # Jobs stolen from one shard share its few prefixes; stealing from each shard in turn computes a
    # prefix per stolen job at the stealer.
    policy = HomeFirst(4, {0}, patience=100)
    backlog = [0, 10, 10, 10]
    feed(policy, policy.shares(4), backlog)  # home lane 0 read dry
    policy.hungry = [False, True, True, True]
    taken = [feed(policy, policy.shares(4), backlog) for _ in range(6)]
    # Lane 1 (the longest waiting) until it runs short, then lane 2, though lane 3 has waited longer.
    assert taken[:4] == [[0, 3, 0, 0], [0, 3, 0, 0], [0, 3, 0, 0], [0, 1, 0, 0]]
    assert taken[4:] == [[0, 0, 3, 0], [0, 0, 3, 0]] and policy.victim == 2


def test_a_lane_that_becomes_stealable_or_yields_an_idle_read_is_read_next():
    policy = HomeFirst(4, {0}, patience=100)
    policy.set_stealable(set())  # every peer has room
    policy.set_stealable({2})  # lane 2's owner has none now
    assert policy.hungry == [True, False, True, False]  # lane 2 tried at once, not after an idle turn
    policy.set_stealable({2, 3})
    assert policy.hungry[3] and policy.stealable == {2, 3}
    policy.hungry = [False, False, False, False]
    policy.idle_read(3, got=1)  # an idle wait took one job from lane 3: the next rounds steal more there
    assert policy.hungry[3] and policy.victim == 3 and policy.stolen == 1
    policy.read_back(0, asked=1, got=0)
    policy.hungry[2] = True
    assert policy.shares(4) == [1, 0, 0, 3]


def test_a_worker_without_home_lanes_only_steals():
    policy = HomeFirst(3, set(), patience=100)
    assert policy.shares(5) == [5, 0, 0]  # nothing hungry: the longest waiting lane
    policy.hungry = [False, False, True]
    assert policy.shares(5) == [0, 0, 5]


def test_home_lanes_start_hungry_so_a_backlog_at_home_is_read_before_stealing():
    policy = HomeFirst(4, {1, 2}, patience=100)
    assert policy.hungry == [False, True, True, False]
    assert policy.shares(6) == [0, 3, 3, 0]
    policy.read_back(1, asked=3, got=1)
    policy.read_back(2, asked=3, got=0)
    policy.move_home({2, 3})
    assert policy.hungry == [False, False, False, True]  # lane 3 is new at home; lane 2 was read dry


def test_an_idle_worker_takes_one_job_from_a_lane_that_is_not_home():
    assert HomeFirst(3, {0}).idle_cap(0) is None and HomeFirst(3, {0}).idle_cap(2) == 1  # all stealable
    assert HomeFirst(3, set()).idle_cap(2) is None  # no home: all the room from any lane
    assert OneLane().idle_cap(0) is None


def test_only_lanes_a_worker_may_read_count_as_its_backlog():
    # A live owner's hungry shard is not this worker's work: counted, an idle worker would poll Redis in
    # rounds that do not block instead of blocking on its own lanes (run/loop.py).
    policy = HomeFirst(4, {0, 1})
    policy.set_stealable(set())
    for k in range(4):
        policy.hungry[k] = k >= 2  # only the peer's lanes 2 and 3 look backlogged
    assert not policy.backlog() and [policy.may_read(k) for k in range(4)] == [True, True, False, False]
    policy.set_stealable({3})  # their owner is full now
    assert policy.backlog()
    policy.read_back(3, asked=2, got=0)
    assert not policy.backlog()
    policy.hungry[0] = True  # work at home
    assert policy.backlog()
    assert ReadShares(3).backlog() is False  # the base rule: any hungry lane


def test_a_stealing_limit_caps_what_is_taken_from_a_lane_until_it_is_set_again():
    # An owner with room for some of its backlog keeps those: only the excess may be stolen.
    policy = HomeFirst(3, {0})
    policy.read_back(0, asked=4, got=0)  # home is empty
    policy.set_stealable({1, 2}, limits={1: 2})
    policy.hungry[1:] = [True, False]  # lane 1 has a backlog
    assert policy.shares(8) == [1, 2, 0]  # a probe home, 2 from lane 1 though 7 are left
    policy.read_back(1, asked=2, got=2)
    assert not policy.may_steal(1) and not policy.backlog()
    policy.set_stealable({1}, limits={1: 3})  # HomeWatch looked again: 3 more past the owner's room
    policy.hungry[1] = True
    assert policy.may_steal(1) and policy.shares(8)[1] == 3
    policy.set_stealable({1})  # the owner is full: no limit
    assert policy.shares(8)[1] == 7

"""ReadShares: the engine's room over the shards of one cycle, one hungry shard's turn at a time."""

from __future__ import annotations

from worker.intake.read_shares import ReadShares


def hungry(shards: int, *which: int, turn: int = 0) -> ReadShares:
    reads = ReadShares(shards, turn=turn)
    for k in which:
        reads.hungry[k] = True
    return reads


def test_no_room_no_reads():
    assert hungry(2, 0).shares(0, first=1) == [0, 0]


def test_the_first_in_the_rotation_reads_all_the_room_when_none_is_hungry():
    assert ReadShares(4).shares(8, first=2) == [0, 0, 8, 0]
    assert ReadShares(2).shares(1, first=0) == [1, 0]


def test_the_room_goes_to_the_turn_less_one_for_the_longest_waiting_shard_that_is_not_hungry():
    assert hungry(4, 2, 3, turn=2).shares(8, first=0) == [1, 0, 7, 0]
    assert hungry(3, 0, 2).shares(9, first=1) == [8, 1, 0]  # not split over the hungry shards
    reads = hungry(4, 3, turn=3)
    reads.waited = [0, 0, 5, 0]
    assert reads.shares(4, first=0) == [0, 0, 1, 3]  # not the rotation's first: the longest waiting


def test_a_turn_that_is_not_hungry_passes_to_the_next_hungry_shard():
    assert hungry(4, 1, turn=2).shares(4, first=0) == [1, 3, 0, 0]


def test_the_turn_moves_on_after_an_engine_full_or_a_short_read():
    reads = hungry(3, 0, 1, 2)
    assert reads.shares(8, first=0) == [8, 0, 0]
    reads.read_back(0, asked=8, got=8)  # a turn's worth (the most room seen): shard 1's turn
    assert reads.shares(3, first=0) == [0, 3, 0]
    reads.read_back(1, asked=3, got=3)  # 3 of 8: still its turn
    assert reads.shares(2, first=0) == [0, 2, 0]
    reads.read_back(1, asked=2, got=1)  # short: it is drained, no longer hungry
    assert reads.hungry == [True, False, True]
    assert reads.shares(4, first=1) == [0, 1, 3]  # shard 1 is probed, shard 2's turn


def test_every_hungry_shard_gets_its_turn():
    """Shards with endless backlogs, room opening a few jobs at a time: each gets about as many jobs."""
    reads = hungry(5, 0, 1, 2, 3, 4)
    got = [0] * 5
    for cycle in range(1000):
        room = 1 + cycle % 4
        shares = reads.shares(room, first=cycle % 5)
        for k, share in enumerate(shares):
            if share:
                reads.read_back(k, asked=share, got=share)
                got[k] += share
    assert min(got) >= 0.9 * max(got), got


def test_a_read_of_another_shard_does_not_count_towards_the_turn():
    reads = hungry(3, 0, 2)
    reads.shares(4, first=1)
    reads.read_back(1, asked=1, got=1)  # the probe found work: shard 1 is hungry now, the turn stays
    assert reads.hungry == [True, True, True]
    assert reads.turn == 0 and reads.taken == 0


def feed(reads: ReadShares, shares: list[int], backlog: list[int]) -> list[int]:
    """Each shard's read answered from `backlog` (entries per shard); returns what each got."""
    got = [min(share, backlog[k]) for k, share in enumerate(shares)]
    for k, share in enumerate(shares):
        if share:
            reads.read_back(k, asked=share, got=got[k])
            backlog[k] -= got[k]
    return got


def test_one_slot_at_a_time_goes_to_the_hungry_shard_at_least_every_other_cycle():
    """8 shards, a backlog on one, one slot free per cycle: probes of the 7 empty ones may take every
    other slot, not 7 in 8 (then the hungry shard waited for the rotation to reach it, and a refill of
    the engine came in pieces)."""
    reads = ReadShares(8)
    backlog = [0, 0, 0, 0, 0, 10**6, 0, 0]
    served = 0
    for cycle in range(200):
        served += feed(reads, reads.shares(1, first=cycle % 8), backlog)[5]
    assert served >= 95, served  # (the first cycles find the backlog)


def test_probes_that_find_work_go_on_every_cycle_and_reach_every_shard():
    """Every shard has a backlog none is known to have, one slot free per cycle: each probe finds a job,
    so the next cycle probes again, and the first jobs come from every shard, not from the first one
    found."""
    reads = ReadShares(8)
    backlog = [10**6] * 8
    firsts = []
    for cycle in range(8):
        got = feed(reads, reads.shares(1, first=cycle % 8), backlog)
        firsts += [k for k in range(8) if got[k]]
    assert sorted(firsts) == list(range(8)), firsts


def test_every_short_shard_is_probed_whatever_the_rotation_when_room_comes():
    """Room comes every other cycle, so the rotation's first is always an even shard then: the probes
    still reach the odd ones, and new work on any shard is read within a bounded number of cycles."""
    reads = ReadShares(8)
    backlog = [0, 0, 0, 0, 10**6, 0, 0, 0]
    probed: set[int] = set()
    for cycle in range(0, 200, 2):
        shares = reads.shares(2, first=cycle % 8)
        probed |= {k for k, share in enumerate(shares) if share and k != 4}
        feed(reads, shares, backlog)
    assert probed == {0, 1, 2, 3, 5, 6, 7}


def test_an_idle_read_that_found_jobs_makes_the_shard_hungry():
    """An idle worker's blocking read took jobs from shard 5: the next rounds read it without blocking
    (before, the idle wait read it again each time the engine emptied, behind every other shard's)."""
    reads = ReadShares(8)
    reads.idle_read(5, got=8)
    assert reads.hungry[5]
    assert reads.shares(8, first=2)[5] == 7

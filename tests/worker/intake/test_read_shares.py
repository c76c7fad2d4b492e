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


def test_the_room_goes_to_the_turn_and_one_to_the_first_in_the_rotation_if_not_hungry():
    assert hungry(4, 2, 3, turn=2).shares(8, first=0) == [1, 0, 8, 0]
    assert hungry(3, 0, 2).shares(9, first=1) == [9, 1, 0]  # not split over the hungry shards
    assert hungry(3, 0, 2).shares(9, first=2) == [9, 0, 0]  # a hungry first waits for its turn


def test_a_turn_that_is_not_hungry_passes_to_the_next_hungry_shard():
    assert hungry(4, 1, turn=2).shares(4, first=0) == [1, 4, 0, 0]


def test_the_turn_moves_on_after_an_engine_full_or_a_short_read():
    reads = hungry(3, 0, 1, 2)
    assert reads.shares(8, first=0) == [8, 0, 0]
    reads.read_back(0, asked=8, got=8)  # a turn's worth (the most room seen): shard 1's turn
    assert reads.shares(3, first=0) == [0, 3, 0]
    reads.read_back(1, asked=3, got=3)  # 3 of 8: still its turn
    assert reads.shares(2, first=0) == [0, 2, 0]
    reads.read_back(1, asked=2, got=1)  # short: it is drained, no longer hungry
    assert reads.hungry == [True, False, True]
    assert reads.shares(4, first=1) == [0, 1, 4]  # shard 1 is probed, shard 2's turn


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

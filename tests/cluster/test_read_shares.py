"""read_shares: the engine's room over the shards of one cycle."""

from __future__ import annotations

from worker.cluster.read_shares import read_shares


def test_no_room_no_reads():
    assert read_shares(0, [True, False], first=1) == [0, 0]


def test_evenly_over_all_when_none_is_hungry():
    assert read_shares(8, [False] * 4, first=0) == [2, 2, 2, 2]
    assert read_shares(1, [False] * 8, first=3) == [1] * 8  # rounded up: the first in the rotation reads it


def test_the_room_goes_to_the_hungry_and_one_to_the_first_in_the_rotation():
    assert read_shares(8, [False, False, True, False], first=0) == [1, 0, 8, 0]
    assert read_shares(9, [True, False, True], first=1) == [5, 1, 5]
    assert read_shares(9, [True, False, True], first=2) == [5, 0, 5]

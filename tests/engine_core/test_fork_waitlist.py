"""ForkWaitlist bookkeeping alone: who waits, who is released, how many slots stay reserved."""

from __future__ import annotations

from engine.core.fork_waitlist import ForkWaitlist
from engine.core.request import RequestStatus
from tests.helpers.engine_core_utils import make_group, make_request


def test_siblings_wait_only_for_a_fresh_parent():
    forks = ForkWaitlist()
    parent, s1, s2 = make_group("g", [1, 2, 3], 3)
    assert forks.add(parent) is False
    assert forks.add(s1) is True and forks.add(s2) is True
    assert s1.status is RequestStatus.WAITING_FOR_FORK and list(forks) == [s1, s2] and len(forks) == 2
    assert forks.num_siblings(parent) == 2
    # A sibling resumed with tokens already produced (a retried job) never waits.
    late = make_request("g-3", [1, 2, 3], sample_index=3, group_id="g", output=[9], n=4)
    assert forks.add(late) is False
    # A parent that already produced tokens takes no siblings either.
    old_parent = make_request("h-0", [4, 5], sample_index=0, group_id="h", output=[9], n=2)
    t1 = make_request("h-1", [4, 5], sample_index=1, group_id="h", n=2)
    forks.add(old_parent)
    assert forks.add(t1) is False


def test_reserved_slots_count_only_running_parents():
    forks = ForkWaitlist()
    parent, s1, s2 = make_group("g", [1, 2, 3], 3)
    for r in (parent, s1, s2):
        forks.add(r)
    parent.status = RequestStatus.WAITING
    assert forks.reserved_slots() == 0
    parent.status = RequestStatus.RUNNING
    assert forks.reserved_slots() == 2
    forks.discard(s1)
    assert forks.reserved_slots() == 1 and list(forks) == [s2]


def test_release_ends_the_wait():
    forks = ForkWaitlist()
    parent, s1, s2 = make_group("g", [1, 2, 3], 3)
    for r in (parent, s1, s2):
        forks.add(r)
    assert forks.release(parent) == [s1, s2] and len(forks) == 0
    later = make_request("g-9", [1, 2, 3], sample_index=2, group_id="g", n=3)
    assert forks.add(later) is False  # the parent forked already: an ordinary request now

    other, o1 = make_group("h", [4], 2)
    forks.add(other)
    forks.add(o1)
    assert forks.release(o1) == []  # a sibling is nobody's parent
    assert forks.release(other) == [o1] and forks.release(other) == []
    assert forks.num_siblings(other) == 0

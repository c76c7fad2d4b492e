"""The scheduler's decode fast path: steps that need no new block skip the allocator, and the finish rules
and fork bookkeeping it skips give the same results."""

from __future__ import annotations

from engine.core.block_manager import KVBlockManager
from engine.core.fork_waitlist import ForkWaitlist
from tests.helpers.engine_core_utils import make_group, make_request, make_requests, make_scheduler, run_step


def test_has_room_is_whether_the_table_holds_the_tokens():
    kv = KVBlockManager(num_blocks=8, block_size=4, enable_prefix_caching=False)
    req = make_request("a", [1, 2, 3, 4, 5])
    assert not kv.has_room("a", 1)  # no table yet
    kv.allocate_slots(req, 5)  # two blocks
    assert kv.has_room("a", 8) and not kv.has_room("a", 9)


def test_fork_waitlist_is_empty_until_a_group_parent_arrives():
    forks = ForkWaitlist()
    assert forks.is_empty()
    forks.add(make_request("solo", [1, 2]))
    assert forks.is_empty()  # n == 1: nothing to remember
    parent, sibling = make_group("g", [1, 2, 3], 2)
    forks.add(parent)
    assert not forks.is_empty()
    forks.add(sibling)
    forks.release(parent)
    assert forks.is_empty()


def test_decode_steps_call_the_allocator_only_when_a_block_fills(monkeypatch):
    sched = make_scheduler(block_size=4, enable_prefix_caching=False)
    (req,) = make_requests(1, 3, 9)
    sched.add_request(req)
    calls: list[int] = []
    allocate = sched.kv.allocate_slots

    def counting(request, n, *args):
        calls.append(request.num_computed_tokens + n)  # tokens the table must hold after it
        return allocate(request, n, *args)

    monkeypatch.setattr(sched.kv, "allocate_slots", counting)
    tables = []
    while sched.has_unfinished_requests():
        out, _ = run_step(sched)
        tables.append(len(out.sequences[0].block_ids))
    # Prefill of 3 tokens, then decodes at context 4..11: a new block only at tokens 5 and 9.
    assert calls == [3, 5, 9]
    assert tables == [1, 1, 2, 2, 2, 2, 3, 3, 3]
    assert req.num_output_tokens == 9

"""n > 1 groups: siblings fork from the parent's final prefill step (copy-on-write of a partial block)."""

from __future__ import annotations

from engine.core.request import RequestStatus
from tests.helpers.engine_core_utils import make_group, make_request, make_scheduler, run_step, work


def add_all(sched, requests):
    for r in requests:
        sched.add_request(r)
    return requests


def refs(sched):
    return [b.ref_cnt for b in sched.kv.pool.blocks]


def test_fork_with_partial_last_block():
    sched = make_scheduler(num_blocks=8)
    parent, s1, s2 = add_all(sched, make_group("g", list(range(10)), 3))
    assert s1.status is RequestStatus.WAITING_FOR_FORK and sched.stats().num_waiting == 3
    out, updated = run_step(sched, lambda s: {"g-0": 10, "g-1": 11, "g-2": 12}[s.request_id])
    assert [(s.request_id, s.num_new_tokens, s.start_pos, s.fork_of) for s in out.sequences] == [
        ("g-0", 10, 0, None),
        ("g-1", 0, 10, "g-0"),
        ("g-2", 0, 10, "g-0"),
    ]
    # First steps: every table whole, and each sample met once by the runner.
    assert [(s.new_block_ids, s.whole_table) for s in out.sequences] == [
        ((0, 1, 2), True),
        ((0, 1, 3), True),
        ((0, 1, 4), True),
    ]
    assert [(n.request_id, n.prompt_token_ids, n.sample_index) for n in out.new_requests] == [
        ("g-0", list(range(10)), 0),
        ("g-1", list(range(10)), 1),
        ("g-2", list(range(10)), 2),
    ]
    assert out.block_copies == [(2, 3), (2, 4)] and out.num_batched_tokens == 10
    assert refs(sched)[:5] == [3, 3, 1, 1, 1]
    assert updated == [parent, s1, s2]
    assert [r.output_token_ids for r in updated] == [[10], [11], [12]]
    assert all(r.num_computed_tokens == 10 and r.status is RequestStatus.RUNNING for r in updated)
    out, _ = run_step(sched)
    assert work(out) == {"g-0": 1, "g-1": 1, "g-2": 1}
    assert [(s.start_pos, s.new_block_ids, s.whole_table) for s in out.sequences] == [(10, (), False)] * 3
    assert out.new_requests == []


def test_fork_on_block_boundary_needs_no_copy():
    sched = make_scheduler(num_blocks=8)
    add_all(sched, make_group("g", list(range(8)), 2))
    out, _ = run_step(sched)
    assert out.block_copies == [] and [s.new_block_ids for s in out.sequences] == [(0, 1), (0, 1)]
    out, _ = run_step(sched)  # each decode now takes its own block: only that one is sent
    assert [(s.new_block_ids, s.whole_table) for s in out.sequences] == [((2,), False), ((3,), False)]


def test_fork_after_chunked_prefill():
    sched = make_scheduler(max_num_batched_tokens=4)
    add_all(sched, make_group("g", list(range(10)), 2))
    assert [list(work(run_step(sched)[0])) for _ in range(3)] == [["g-0"], ["g-0"], ["g-0", "g-1"]]


def test_fork_without_a_free_block_falls_back_to_recompute():
    # 4 blocks: parent takes 3, one sibling gets the last one, the other must recompute later.
    sched = make_scheduler(num_blocks=4)
    parent, s1, s2 = add_all(sched, make_group("g", list(range(10)), 3, max_tokens=1))
    out, _ = run_step(sched)
    assert [s.request_id for s in out.sequences] == ["g-0", "g-1"]
    assert s2.status is RequestStatus.WAITING and parent.is_finished and s1.is_finished
    out, _ = run_step(sched)
    (seq,) = out.sequences
    assert (seq.request_id, seq.start_pos, seq.fork_of) == ("g-2", 8, None)  # full blocks hit the cache
    assert s2.is_finished and sched.kv.num_used_blocks == 0


def test_siblings_count_against_max_num_seqs():
    sched = make_scheduler(max_num_seqs=3)
    add_all(sched, make_group("g", list(range(6)), 3))
    other = make_request("x", [1, 2], arrival=1)
    sched.add_request(other)
    out, _ = run_step(sched)
    assert list(work(out)) == ["g-0", "g-1", "g-2"]
    assert other.status is RequestStatus.WAITING


def test_slots_reserved_for_siblings_during_chunked_prefill():
    sched = make_scheduler(max_num_seqs=3, max_num_batched_tokens=4)
    add_all(sched, make_group("g", list(range(10)), 2))
    other = make_request("x", [1, 2], arrival=1)
    sched.add_request(other)
    run_step(sched)  # the parent's first chunk uses the whole budget
    out, _ = run_step(sched)
    assert list(work(out)) == ["g-0"]  # budget again; x waits
    out, _ = run_step(sched)
    assert list(work(out)) == ["g-0", "g-1", "x"]


def test_resumed_group_is_scheduled_independently():
    sched = make_scheduler()
    group = make_group("g", list(range(6)), 2)
    group[0].output_token_ids.extend([5])
    group[1].output_token_ids.extend([6])
    add_all(sched, group)
    assert all(r.status is RequestStatus.WAITING for r in group)
    out, _ = run_step(sched)
    assert [(s.request_id, s.num_new_tokens, s.fork_of) for s in out.sequences] == [
        ("g-0", 7, None),
        ("g-1", 7, None),
    ]


def test_abort_waiting_for_fork_sibling_and_parent():
    sched = make_scheduler()
    parent, s1, s2 = add_all(sched, make_group("g", list(range(6)), 3))
    assert sched.abort_request("g-1")
    sched.check_invariants()
    assert sched.abort_request("g-0")  # the remaining sibling can no longer fork: it runs on its own
    assert s2.status is RequestStatus.WAITING
    sched.check_invariants()
    out, _ = run_step(sched)
    assert [(s.request_id, s.num_new_tokens) for s in out.sequences] == [("g-2", 6)]


def test_group_under_block_pressure_finishes_and_frees_everything():
    sched = make_scheduler(num_blocks=6, max_num_batched_tokens=4)
    first = make_request("a", [1, 2, 3, 4], 8, arrival=0)
    sched.add_request(first)
    run_step(sched)
    add_all(sched, make_group("g", list(range(10, 22)), 2, max_tokens=2, arrival=1))
    for _ in range(8):
        out, _ = run_step(sched)
        if out.preempted_ids:
            break
    sched.check_invariants()
    while sched.has_unfinished_requests():
        out, _ = run_step(sched)
        assert all(s.fork_of in (None, "g-0") for s in out.sequences)
    assert sched.kv.num_used_blocks == 0

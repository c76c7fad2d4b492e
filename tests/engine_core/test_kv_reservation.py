"""kv_allocation "reserve_max": a request's whole max_model_len is reserved at admission (as contiguous
allocation does), it never allocates again, and a reservation that does not fit waits or is refused."""

from __future__ import annotations

import pytest

from engine.config import EngineConfig, SchedulerConfig
from engine.core.block_manager import Allocation, KVBlockManager
from engine.errors import RejectReason, RequestRejected
from tests.helpers.engine_core_utils import make_group, make_request, make_requests, make_scheduler, run_step


def test_admission_reserves_the_whole_length_and_decodes_take_nothing():
    kv = KVBlockManager(num_blocks=10, block_size=4, reserve_tokens=16)
    req = make_request("a", list(range(5)), 8)
    alloc = kv.allocate_slots(req, 5)
    assert alloc is not None and alloc.new_block_ids == (0, 1, 2, 3)  # 16 tokens, not the prompt's 2 blocks
    req.num_computed_tokens = 5
    kv.check_invariants()
    for token in range(11):  # up to the reservation's last slot
        req.append_output_token(token)
        assert kv.has_room("a", req.num_tokens)
        assert kv.allocate_slots(req, 1) == Allocation(())
        req.num_computed_tokens += 1
        kv.check_invariants()
    assert kv.block_ids("a") == (0, 1, 2, 3) and kv.num_free_blocks == 6
    kv.free(req)
    kv.check_invariants()
    assert kv.num_free_blocks == 10 and kv.tables == {}


def test_a_reservation_that_does_not_fit_changes_nothing():
    kv = KVBlockManager(num_blocks=7, block_size=4, reserve_tokens=16)
    a, b = make_requests(2, 3, 2)
    assert kv.allocate_slots(a, 3) is not None
    assert kv.allocate_slots(b, 3) is None  # 3 free blocks, 4 reserved per request
    assert kv.num_free_blocks == 3 and kv.block_ids("r1") == ()
    kv.check_invariants()


def test_paged_takes_only_what_the_tokens_fill():
    kv = KVBlockManager(num_blocks=10, block_size=4)
    alloc = kv.allocate_slots(make_request("a", list(range(5)), 8), 5)
    assert alloc is not None and alloc.new_block_ids == (0, 1)


def test_scheduler_admits_what_fits_the_reservations_and_leaks_nothing():
    # 9 blocks hold two reservations of 16 tokens (4 blocks each); paged would run all three at once.
    sched = make_scheduler(kv_allocation="reserve_max", max_model_len=16, block_size=4, num_blocks=9)
    reqs = make_requests(3, 4, 3)
    for r in reqs:
        sched.add_request(r)
    out, _ = run_step(sched)
    assert [s.request_id for s in out.sequences] == ["r0", "r1"]
    assert [len(s.new_block_ids) for s in out.sequences] == [4, 4]
    assert sched.kv.num_used_blocks == 8 and [r.request_id for r in sched.waiting] == ["r2"]
    while not reqs[0].is_finished:
        out, _ = run_step(sched)
        assert all(s.new_block_ids == () for s in out.sequences)  # running requests never allocate again
    out, _ = run_step(sched)
    assert [(s.request_id, len(s.new_block_ids)) for s in out.sequences] == [("r2", 4)]
    while sched.has_unfinished_requests():
        run_step(sched)
    assert sched.kv.num_used_blocks == 0 and sched.stats().num_preemptions == 0


def test_paged_scheduler_runs_the_same_requests_at_once():
    sched = make_scheduler(max_model_len=16, block_size=4, num_blocks=9)
    for r in make_requests(3, 4, 3):
        sched.add_request(r)
    out, _ = run_step(sched)
    assert [s.request_id for s in out.sequences] == ["r0", "r1", "r2"]


def test_a_reservation_larger_than_the_pool_is_refused_at_once():
    sched = make_scheduler(kv_allocation="reserve_max", max_model_len=16, block_size=4, num_blocks=3)
    with pytest.raises(
        RequestRejected, match=r"reserves max_model_len \(16\) tokens per request: 4 KV blocks"
    ) as e:
        sched.add_request(make_request("a", [1, 2], 1))  # 3 tokens: paged would take one block
    assert e.value.reason is RejectReason.TOO_LONG_FOR_KV_CACHE
    assert not sched.requests and sched.kv.num_used_blocks == 0


def test_forked_samples_reserve_too():
    sched = make_scheduler(kv_allocation="reserve_max", max_model_len=16, block_size=4, num_blocks=12)
    group = make_group("g", list(range(6)), 2, max_tokens=4)
    for r in group:
        sched.add_request(r)
    out, _ = run_step(sched)
    # The parent reserves blocks 0-3; the sample shares full block 0, copies partial block 1 into 4 and
    # reserves 5, 6 for the rest of its 16 tokens.
    assert [(s.request_id, s.new_block_ids) for s in out.sequences] == [
        ("g-0", (0, 1, 2, 3)),
        ("g-1", (0, 4, 5, 6)),
    ]
    while sched.has_unfinished_requests():
        out, _ = run_step(sched)
        assert all(s.new_block_ids == () for s in out.sequences)
    assert sched.kv.num_used_blocks == 0


def test_a_fork_that_cannot_reserve_falls_back_to_waiting():
    # 6 blocks: the parent's 4, then 2 free, short of the sample's copy + 2 reserved blocks.
    sched = make_scheduler(kv_allocation="reserve_max", max_model_len=16, block_size=4, num_blocks=6)
    for r in make_group("g", list(range(6)), 2, max_tokens=4):
        sched.add_request(r)
    out, _ = run_step(sched)
    assert [s.request_id for s in out.sequences] == ["g-0"]
    assert sched.kv.num_used_blocks == 4 and [r.request_id for r in sched.waiting] == ["g-1"]
    while sched.has_unfinished_requests():
        run_step(sched)
    assert sched.kv.num_used_blocks == 0


def test_the_option_is_validated():
    with pytest.raises(ValueError, match="kv_allocation must be one of paged, reserve_max; got 'contiguous'"):
        EngineConfig(model="m", kv_allocation="contiguous")
    with pytest.raises(ValueError, match="kv_allocation must be one of"):
        SchedulerConfig(num_blocks=4, kv_allocation="max")
    assert EngineConfig(model="m").kv_allocation == "paged"

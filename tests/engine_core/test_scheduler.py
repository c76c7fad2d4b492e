"""Scheduler policy: token budget, admissions, preemption, static batches, rejection, stopping."""

from __future__ import annotations

import pytest

from engine.core.finish_rules import check_stop
from engine.core.request import RequestStatus
from engine.core.scheduler_output import RunnerOutput
from engine.errors import RejectReason, RequestRejected
from tests.helpers.engine_core_utils import (
    EOS,
    TOKEN,
    make_request,
    make_requests,
    make_scheduler,
    run_step,
    work,
)


def add_all(sched, requests):
    for r in requests:
        sched.add_request(r)
    return requests


def test_chunked_prefill_under_tiny_budget():
    sched = make_scheduler(max_num_batched_tokens=4)
    (r,) = add_all(sched, make_requests(1, 10, 2))
    chunks = []
    for _ in range(3):
        out, updated = run_step(sched)
        (seq,) = out.sequences
        chunks.append((seq.start_pos, seq.num_new_tokens, seq.sample, seq.new_block_ids, seq.whole_table))
    # Blocks reach the runner as they are appended: the whole table once, then only the new ones.
    assert chunks == [(0, 4, False, (0,), True), (4, 4, False, (1,), False), (8, 2, True, (2,), False)]
    assert r.output_token_ids == [TOKEN] and updated == [r]


def test_decodes_keep_flowing_while_long_prompt_prefills():
    sched = make_scheduler(max_num_batched_tokens=5)
    short, long = make_requests(2, 4, 20)
    long.prompt_token_ids = long.prompt_token_ids * 5  # 20 tokens
    sched.add_request(short)
    run_step(sched)
    sched.add_request(long)
    for k in range(5):
        out, updated = run_step(sched)
        assert work(out) == {"r0": 1, "r1": 4}
        assert updated == ([short, long] if k == 4 else [short])
    assert short.num_output_tokens == 6


def test_max_num_seqs_caps_the_batch():
    sched = make_scheduler(max_num_seqs=2)
    reqs = add_all(sched, make_requests(3, 4, 2))
    out, _ = run_step(sched)
    assert list(work(out)) == ["r0", "r1"]
    assert sched.stats().num_waiting == 1
    out, _ = run_step(sched)  # both finish this step and leave `running` at once
    assert list(work(out)) == ["r0", "r1"] and all(r.is_finished for r in reqs[:2])
    assert sched.running == []
    out, _ = run_step(sched)
    assert list(work(out)) == ["r2"]


def test_finished_leave_and_waiting_join_next_step():
    sched = make_scheduler(max_num_seqs=1)
    a, b = add_all(sched, make_requests(2, 3, 1))
    out, updated = run_step(sched)
    assert updated == [a] and a.status is RequestStatus.FINISHED_LENGTH and sched.running == []
    assert sched.kv.num_used_blocks == 0
    out, _ = run_step(sched)
    assert list(work(out)) == ["r1"]


def _fill_pool(policy: str, reqs):
    # 4 blocks of 4; two 4-token prompts decode until the pool is full (4 blocks = 16 token slots).
    sched = make_scheduler(num_blocks=4, policy=policy)
    add_all(sched, reqs)
    for _ in range(5):
        out, _ = run_step(sched)
        assert out.preempted_ids == []
    return sched


def test_preemption_fcfs_takes_latest_admitted():
    r0, r1 = make_requests(2, 4, 8)
    sched = _fill_pool("fcfs", [r0, r1])
    assert r0.num_tokens == r1.num_tokens == 9 and sched.kv.num_free_blocks == 0
    out, _ = run_step(sched)
    assert out.preempted_ids == ["r1"] and list(work(out)) == ["r0"]
    assert r1.status is RequestStatus.PREEMPTED and r1.num_computed_tokens == 0
    assert r1.output_token_ids == [TOKEN] * 5 and r1.num_preemptions == 1
    assert sched.waiting.peek() is r1 and sched.stats().num_preemptions == 1
    # r1 freed [1, 3] tail first, so r0 takes 3 (the end of r1's context) and block 1 stays cached.
    assert sched.kv.block_ids("r0") == (0, 2, 3)


def test_preempted_request_goes_to_front_and_is_recomputed():
    r0, r1, r2 = make_requests(3, 4, 8)
    sched = make_scheduler(num_blocks=4, max_num_seqs=2)
    add_all(sched, [r0, r1, r2])
    while r1.status is not RequestStatus.PREEMPTED:
        run_step(sched)
    assert list(sched.waiting) == [r1, r2]
    while not r0.is_finished:
        run_step(sched)
    out, _ = run_step(sched)
    (seq,) = [s for s in out.sequences if s.request_id == "r1"]
    # Its prompt block survived in the prefix cache; its output block was evicted and is recomputed.
    assert (seq.start_pos, seq.num_new_tokens, seq.sample) == (4, 5, True)  # 4 prompt + 5 outputs


def test_preemption_priority_takes_lowest_priority_even_if_admitted_first():
    low = make_request("low", [1, 2, 3, 4], priority=5, arrival=0)
    high = make_request("high", [5, 6, 7, 8], priority=0, arrival=1)
    sched = _fill_pool("priority", [low, high])
    assert [r.request_id for r in sched.running] == ["high", "low"]
    out, _ = run_step(sched)
    assert out.preempted_ids == ["low"] and list(work(out)) == ["high"]


def test_preemption_priority_ties_go_to_latest_arrival():
    a = make_request("a", [1, 2, 3, 4], priority=1, arrival=0)
    b = make_request("b", [5, 6, 7, 8], priority=1, arrival=1)
    sched = _fill_pool("priority", [b, a])
    out, _ = run_step(sched)
    assert out.preempted_ids == ["b"]


def test_priority_waiting_order():
    sched = make_scheduler(max_num_seqs=1, policy="priority")
    add_all(
        sched,
        [
            make_request("late-urgent", [1], 1, priority=0, arrival=3),
            make_request("lazy", [2], 1, priority=9, arrival=0),
            make_request("early-urgent", [3], 1, priority=0, arrival=1),
        ],
    )
    order = [next(iter(work(run_step(sched)[0]))) for _ in range(3)]
    assert order == ["early-urgent", "late-urgent", "lazy"]


def test_static_admits_only_after_whole_batch_finished():
    sched = make_scheduler(max_num_seqs=2, scheduling="static")
    a, b, c = make_requests(3, 4, 1)
    b.params = b.params.model_copy(update={"max_tokens": 3})
    add_all(sched, [a, b, c])
    out, _ = run_step(sched)
    assert list(work(out)) == ["r0", "r1"] and a.is_finished
    assert list(work(run_step(sched)[0])) == ["r1"]  # continuous would admit r2 here
    assert list(work(run_step(sched)[0])) == ["r1"] and b.is_finished
    assert list(work(run_step(sched)[0])) == ["r2"]


def test_static_batch_fills_while_its_prefill_spans_steps():
    # A budget of 6 tokens prefills 4-token prompts over several steps; the batch is still r0..r2.
    sched = make_scheduler(max_num_seqs=3, max_num_batched_tokens=6, scheduling="static")
    reqs = make_requests(5, 4, 3)
    add_all(sched, reqs)
    admitted = []
    while not reqs[2].is_finished:
        admitted += [r for r in work(run_step(sched)[0]) if r not in admitted]
    assert admitted == ["r0", "r1", "r2"]
    while sched.running:
        assert "r3" not in work(run_step(sched)[0])
    assert list(work(run_step(sched)[0])) == ["r3", "r4"]  # the next batch


def test_continuous_admits_into_freed_slot():
    sched = make_scheduler(max_num_seqs=2)
    a, b, c = make_requests(3, 4, 1)
    b.params = b.params.model_copy(update={"max_tokens": 3})
    add_all(sched, [a, b, c])
    run_step(sched)
    assert list(work(run_step(sched)[0])) == ["r1", "r2"]


def test_rejects_requests_that_can_never_fit():
    sched = make_scheduler(max_model_len=16, num_blocks=3, block_size=4)
    with pytest.raises(
        RequestRejected, match=r"prompt \(10 tokens\) \+ max_tokens \(8\) = 18 exceeds max_model_len \(16\)"
    ) as too_long:
        sched.add_request(make_request("a", list(range(10)), 8))
    assert too_long.value.reason is RejectReason.TOO_LONG_FOR_MODEL
    with pytest.raises(
        RequestRejected, match="13 tokens need 4 KV blocks of 4 tokens, but the whole pool has 3"
    ) as too_big:
        sched.add_request(make_request("b", list(range(10)), 3))
    assert too_big.value.reason is RejectReason.TOO_LONG_FOR_KV_CACHE
    with pytest.raises(RequestRejected, match="empty") as empty:
        sched.add_request(make_request("c", [], 3))
    assert empty.value.reason is RejectReason.EMPTY_PROMPT
    assert isinstance(RequestRejected(RejectReason.EMPTY_PROMPT, "x"), ValueError)
    sched.add_request(make_request("d", list(range(10)), 2))
    with pytest.raises(RequestRejected, match="already queued") as dup:
        sched.add_request(make_request("d", list(range(10)), 2))
    assert dup.value.reason is RejectReason.DUPLICATE_ID
    assert not sched.kv.num_used_blocks and list(sched.requests) == ["d"]


def _run_one(request, tokens, **overrides):
    sched = make_scheduler(**overrides)
    sched.add_request(request)
    it = iter(tokens)
    while not request.is_finished:
        run_step(sched, lambda s: next(it))
    assert sched.kv.num_used_blocks == 0 and not sched.has_unfinished_requests()
    return request.finish_reason, request.output_token_ids


def test_eos_stops():
    assert _run_one(make_request("a", [1, 2], 8), [5, EOS, 5]) == ("stop", [5, EOS])


def test_eos_ignored_before_min_tokens():
    assert _run_one(make_request("a", [1, 2], 8, min_tokens=3), [EOS, EOS, EOS, 5]) == (
        "stop",
        [EOS, EOS, EOS],
    )


def test_ignore_eos():
    assert _run_one(make_request("a", [1, 2], 3, ignore_eos=True), [EOS] * 3) == ("length", [EOS] * 3)


def test_stop_token_ids_respect_min_tokens():
    req = make_request("a", [1, 2], 8, stop_token_ids=[9], min_tokens=2)
    assert _run_one(req, [9, 9, 5]) == ("stop", [9, 9])


def test_max_tokens_counts_prior_output():
    req = make_request("a", [1, 2], 4, output=[5, 5])
    assert _run_one(req, [6, 6, 6]) == ("length", [5, 5, 6, 6])


def test_max_model_len_stops():
    # Bypasses validation (a resumed request whose limits changed): the context limit still holds.
    req = make_request("a", [1, 2, 3], 100)
    req.append_output_token(5)
    assert check_stop(req, 5, frozenset({EOS}), max_model_len=4) is RequestStatus.FINISHED_LENGTH
    assert check_stop(req, 5, frozenset({EOS}), max_model_len=5) is None


def test_finish_request_from_outside_frees_blocks():
    sched = make_scheduler()
    (a,) = add_all(sched, make_requests(1, 6, 8))
    run_step(sched)
    assert sched.finish_request("r0", RequestStatus.FINISHED_STOPPED)
    assert a.finish_reason == "stop" and sched.running == [] and sched.kv.num_used_blocks == 0
    assert sched.get_request("r0") is None
    sched.check_invariants()


def test_abort_in_every_state_frees_blocks():
    sched = make_scheduler(num_blocks=4, max_num_batched_tokens=6, max_num_seqs=3)
    running, prefilling, waiting = make_requests(3, 4, 8)
    prefilling.prompt_token_ids = list(range(10, 18))
    add_all(sched, [running, prefilling, waiting])
    run_step(sched)  # running: 4 tokens; prefilling: 2 of 8; waiting: out of budget
    assert prefilling.status is RequestStatus.RUNNING and prefilling.num_computed_tokens == 2
    assert waiting.status is RequestStatus.WAITING
    for req in (waiting, prefilling, running):
        assert sched.abort_request(req.request_id)
        assert req.status is RequestStatus.FINISHED_ABORTED and req.finish_reason == "abort"
        sched.check_invariants()
    assert sched.kv.num_used_blocks == 0 and not sched.has_unfinished_requests()
    assert not sched.abort_request("nope")


def test_abort_preempted_request():
    r0, r1 = make_requests(2, 4, 8)
    sched = _fill_pool("fcfs", [r0, r1])
    run_step(sched)
    assert r1.status is RequestStatus.PREEMPTED
    assert sched.abort_request("r1") and len(sched.waiting) == 0
    assert sched.abort_request("r0") and sched.kv.num_used_blocks == 0
    sched.check_invariants()


def test_abort_mid_step_is_ignored_by_update():
    sched = make_scheduler()
    (a,) = add_all(sched, make_requests(1, 4, 8))
    out = sched.schedule()
    sched.abort_request("r0")
    assert sched.update_from_output(out, RunnerOutput({"r0": TOKEN})) == []
    assert a.output_token_ids == [] and sched.kv.num_used_blocks == 0
    sched.check_invariants()


def test_prefix_cache_reuse_across_requests_and_stats():
    sched = make_scheduler()
    prompt = list(range(10))
    a = make_request("a", prompt, 1)
    sched.add_request(a)
    run_step(sched)
    b = make_request("b", prompt, 1)
    sched.add_request(b)
    out, _ = run_step(sched)
    (seq,) = out.sequences
    assert (seq.start_pos, seq.num_new_tokens, b.num_cached_tokens) == (8, 2, 8)
    s = sched.stats()
    assert (s.prefix_cache_queries, s.prefix_cache_hits, s.num_blocks_used, s.num_running) == (20, 8, 0, 0)
    assert s.num_blocks_free == s.num_blocks_total == 64 and s.num_cached_blocks == 2


def test_free_capacity_counts_slots_and_evictable_blocks():
    sched = make_scheduler(max_num_seqs=4, num_blocks=10)
    add_all(sched, make_requests(3, 4, 8))
    run_step(sched)
    assert sched.free_capacity() == (1, 7)


def test_a_request_whose_prefix_is_being_computed_waits_for_it_instead_of_computing_it_again():
    sched = make_scheduler()
    prompt = list(range(40))  # 10 blocks of 4: at least DEFER_MIN_TOKENS of them being computed
    a, b = make_request("a", prompt, 2), make_request("b", prompt + [7], 2)
    c = make_request("c", [900 + i for i in range(8)], 2)
    add_all(sched, [a, b, c])
    out, _ = run_step(sched)
    assert work(out) == {"a": 40, "c": 8}  # b waits a step; c, behind it, is not held up
    assert [r.request_id for r in sched.waiting] == ["b"]
    out, _ = run_step(sched)
    assert work(out)["b"] == 1 and b.num_cached_tokens == 40  # the prefix computed once
    assert sched.stats().prefix_cache_hits == 40


def test_the_wait_lasts_a_chunked_prefill_and_ends_when_the_computing_request_goes():
    sched = make_scheduler(max_num_batched_tokens=16)
    prompt = list(range(40))
    a, b = make_request("a", prompt, 2), make_request("b", prompt, 2)
    add_all(sched, [a, b])
    assert [list(work(run_step(sched)[0])) for _ in range(2)] == [["a"], ["a"]]  # a's chunks of 16
    sched.abort_request("a")  # its blocks will never be registered: b computes them itself
    out, _ = run_step(sched)
    assert work(out) == {"b": 8} and b.num_cached_tokens == 32  # the two chunks a registered
    sched.check_invariants()


def test_a_short_shared_prefix_is_computed_beside_it_without_waiting():
    sched = make_scheduler()
    add_all(sched, [make_request("a", list(range(12)), 2), make_request("b", list(range(12)), 2)])
    out, _ = run_step(sched)
    assert work(out) == {"a": 12, "b": 12}  # 8 tokens shared: less than a step's wait is worth

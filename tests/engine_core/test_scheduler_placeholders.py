"""Scheduling the next step before the last one's tokens are back (async scheduling), at the scheduler:
the token in flight is a placeholder the next step decodes; the limits count it; a request preempted or
finished meanwhile is handled when the tokens arrive."""

from __future__ import annotations

from engine.core.request import RequestStatus
from engine.core.scheduler_output import RunnerOutput
from tests.helpers.engine_core_utils import EOS, TOKEN, make_request, make_scheduler


def _sampled(out, token=TOKEN):
    return RunnerOutput({s.request_id: token for s in out.sequences if s.sample})


def test_the_next_step_decodes_the_token_in_flight():
    sched = make_scheduler()
    req = make_request("a", [1, 2, 3], max_tokens=5)
    sched.add_request(req)
    first = sched.schedule()  # prefill, samples token 0
    second = sched.schedule()  # before the first is back: decodes that token at position 3
    assert [(s.start_pos, s.num_new_tokens, s.sample) for s in first.sequences] == [(0, 3, True)]
    assert [(s.start_pos, s.num_new_tokens, s.sample) for s in second.sequences] == [(3, 1, True)]
    assert req.num_output_placeholders == 2 and req.num_computed_tokens == 4
    sched.update_from_output(first, _sampled(first, 11))
    sched.update_from_output(second, _sampled(second, 12))
    assert req.output_token_ids == [11, 12] and req.num_output_placeholders == 0
    sched.check_invariants()


def test_tokens_in_flight_count_towards_max_tokens():
    sched = make_scheduler()
    req = make_request("a", [1, 2, 3], max_tokens=2)
    sched.add_request(req)
    outs = [sched.schedule(), sched.schedule()]
    assert sched.schedule().is_empty  # two tokens in flight reach max_tokens: nothing more to compute
    for out in outs:
        sched.update_from_output(out, _sampled(out))
    assert req.status is RequestStatus.FINISHED_LENGTH and req.output_token_ids == [TOKEN, TOKEN]


def test_a_request_finished_meanwhile_drops_the_token_computed_after_it():
    sched = make_scheduler()
    req = make_request("a", [1, 2, 3], max_tokens=8)
    sched.add_request(req)
    first, second = sched.schedule(), sched.schedule()
    updated = sched.update_from_output(first, _sampled(first, EOS))
    assert req.status is RequestStatus.FINISHED_STOPPED and updated == [req]
    assert sched.update_from_output(second, _sampled(second, 5)) == []
    assert req.output_token_ids == [EOS]
    third = sched.schedule()
    assert third.finished_ids == ["a"] and third.is_empty
    sched.check_invariants()


def test_a_request_preempted_meanwhile_still_gets_its_token_and_resumes_whole():
    sched = make_scheduler(num_blocks=3, block_size=4)
    a, b = make_request("a", [1, 2, 3, 4], max_tokens=6), make_request("b", [5, 6, 7, 8], max_tokens=6)
    sched.add_request(a)
    sched.add_request(b)
    first = sched.schedule()  # two blocks, one left
    second = sched.schedule()  # a takes the last block; b needs one more and preempts itself
    assert second.preempted_ids == ["b"] and b.status is RequestStatus.PREEMPTED
    sched.update_from_output(first, _sampled(first, 9))
    sched.update_from_output(second, _sampled(second, 9))
    assert b.output_token_ids == [9] and b.num_output_placeholders == 0 and a.output_token_ids == [9, 9]
    sched.check_invariants()
    sched.finish_request("a", RequestStatus.FINISHED_ABORTED)
    resumed = sched.schedule()
    (seq,) = resumed.sequences
    assert (seq.request_id, seq.start_pos, seq.num_new_tokens, seq.whole_table) == ("b", 0, 5, True)
    assert resumed.finished_ids == ["a"] and resumed.new_requests == []  # the runner kept b's state

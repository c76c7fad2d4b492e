"""Admission as a pure decision (job_path.decide): a job's lookups' replies in, its fate out. No Redis."""

from __future__ import annotations

import json

import pytest
import redis

from worker.config import WorkerConfig
from worker.error_codes import ErrorCode
from worker.job_path import Admit, Duplicate, Full, Here, Hold, Left, Refuse, Running, decide
from worker.keys import EVENT_FIELD
from worker.protocol import Job
from worker.wire.job_record import Arrived, InFlight

CFG = WorkerConfig(group="g", consumer="me", max_attempts=3)
NOW = 1_700_000_000_000
IDLE = Here(local=None, busy=False, alone=False)
ENTRY = Arrived(b"1700000000000-0", {})


def job(**fields) -> Job:
    return Job.model_validate({"id": "a", "prompt": "x", "max_tokens": 4, **fields})


def replies(owner=None, count=None, ran_alone=None, entries=(), cancelled=0) -> list:
    return [owner, [count, ran_alone], list(entries), cancelled]


def event(seq: int, **payload) -> tuple[bytes, dict[bytes, bytes]]:
    return (f"0-{seq}".encode(), {EVENT_FIELD: json.dumps(payload).encode()})


def test_a_new_job_nobody_owns_is_admitted_from_its_first_event():
    decision = decide(job(), ENTRY, replies(), CFG, NOW, IDLE)
    assert isinstance(decision, Admit)
    assert (decision.suspect, decision.prior, decision.cancelled) == (False, None, False)
    assert decision.job.next_seq == 1 and decision.job.entry_id == ENTRY.entry_id
    assert decision.job.enqueued_ms == 1_700_000_000_000 and decision.job.admitted_ms == NOW


def test_a_job_with_published_tokens_resumes_after_them():
    entries = [
        event(1, type="token", index=0, token_ids=[5, 6]),
        event(2, type="token", index=2, token_ids=[7]),
    ]
    decision = decide(job(), ENTRY, replies(count=b"1", entries=entries), CFG, NOW, IDLE)
    assert isinstance(decision, Admit)
    assert decision.prior == [[5, 6, 7]] and decision.job.next_seq == 3 and decision.suspect


def test_a_cancelled_job_is_admitted_to_be_aborted_at_once():
    decision = decide(job(), ENTRY, replies(cancelled=1), CFG, NOW, IDLE)
    assert isinstance(decision, Admit) and decision.cancelled


def test_a_full_redis_decides_nothing():
    full = redis.OutOfMemoryError("OOM command not allowed")
    assert decide(job(), ENTRY, [full, full, full, full], CFG, NOW, IDLE) == Full(full)


def test_a_job_another_worker_owns_is_a_duplicate_when_new_and_left_when_reclaimed():
    assert decide(job(), ENTRY, replies(owner=b"other"), CFG, NOW, IDLE) == Duplicate("a", forget=False)
    reclaimed = Arrived(ENTRY.entry_id, {}, reclaimed=True)
    assert decide(job(), reclaimed, replies(owner=b"other"), CFG, NOW, IDLE) == Left()


def test_a_job_running_here_is_a_duplicate_unless_it_is_the_same_entry():
    local = InFlight(job(), ENTRY.entry_id, 0.0, 0.0, 1, 1)
    here = Here(local=local, busy=True, alone=False)
    assert decide(job(), ENTRY, replies(owner=b"me"), CFG, NOW, here) == Running()
    other = Arrived(b"1700000000001-0", {})
    assert decide(job(), other, replies(owner=b"me"), CFG, NOW, here) == Duplicate("a", forget=False)


def test_our_own_owner_key_does_not_make_a_duplicate():
    assert isinstance(decide(job(), ENTRY, replies(owner=b"me"), CFG, NOW, IDLE), Admit)


def test_a_job_that_finished_before_is_a_duplicate_whose_bookkeeping_goes():
    entries = [event(1, type="token", index=0, token_ids=[5]), event(2, type="done")]
    assert decide(job(), ENTRY, replies(entries=entries), CFG, NOW, IDLE) == Duplicate("a", forget=True)


def test_a_failed_lookup_refuses_the_job_as_an_internal_error():
    got = decide(job(), ENTRY, [None, redis.ResponseError("WRONGTYPE"), [], 0], CFG, NOW, IDLE)
    assert isinstance(got, Refuse) and got.error.code == ErrorCode.INTERNAL and got.owned


@pytest.mark.parametrize("ran_alone, expected", [(b"1", Refuse), (None, Admit)])
def test_attempts_run_out_only_once_one_of_them_ran_alone(ran_alone, expected):
    got = decide(job(), ENTRY, replies(count=b"3", ran_alone=ran_alone), CFG, NOW, IDLE)
    assert isinstance(got, expected)
    if isinstance(got, Refuse):
        assert got.error.code == ErrorCode.TOO_MANY_ATTEMPTS and got.error.job_id == "a"


def test_a_job_past_its_deadline_is_refused():
    got = decide(job(deadline_ms=NOW), ENTRY, replies(), CFG, NOW, IDLE)
    assert isinstance(got, Refuse) and got.error.code == ErrorCode.DEADLINE_EXCEEDED
    assert isinstance(decide(job(deadline_ms=NOW + 1), ENTRY, replies(), CFG, NOW, IDLE), Admit)


def test_a_suspect_waits_for_an_empty_worker_and_anything_waits_while_one_runs_alone():
    busy = Here(local=None, busy=True, alone=False)
    assert decide(job(), ENTRY, replies(count=b"1"), CFG, NOW, busy) == Hold("a")
    assert isinstance(decide(job(), ENTRY, replies(), CFG, NOW, busy), Admit)
    alone = Here(local=None, busy=True, alone=True)
    assert decide(job(), ENTRY, replies(), CFG, NOW, alone) == Hold("a")

"""One job's stages (job_path.py), each moved by the replies of the round that carried its commands.

Workers driven one `tick()` at a time against a real redis-server, with the fake engine.
"""

from __future__ import annotations

import json

import pytest

from tests.helpers.worker_fakes import FakeEngine
from worker.client import enqueue
from worker.config import WorkerConfig
from worker.connection import connect
from worker.keys import EVENT_FIELD, JOB_FIELD, Keys
from worker.run.loop import Worker
from worker.wire.job_record import Stage

pytestmark = pytest.mark.redis
K = Keys()
S = Stage


def make_worker(url: str) -> tuple[Worker, dict[str | bytes, list[Stage]]]:
    worker = Worker(FakeEngine(step_s=0), connect(url), WorkerConfig(group="test", consumer="w", block_ms=20))
    trail: dict[str | bytes, list[Stage]] = {}
    worker.lanes[0].path.on_stage = lambda name, stage: trail.setdefault(name, []).append(stage)
    worker.start()
    return worker, trail


def tick_until(worker: Worker, done, limit: int = 200) -> None:
    for _ in range(limit):
        if done():
            return
        worker.tick()
    raise AssertionError(f"not done after {limit} ticks")


def stop(worker: Worker) -> None:
    worker.stop.request()
    worker.shutdown()


def test_a_job_goes_read_admitted_running_finished_acknowledged(redis_server, r):
    worker, trail = make_worker(redis_server.url)
    try:
        enqueue(r, {"id": "a", "prompt": "abc", "max_tokens": 3})
        tick_until(worker, lambda: trail.get("a", [])[-1:] == [S.ACKNOWLEDGED])
        assert trail["a"] == [S.ADMITTED, S.RUNNING, S.FINISHED, S.ACKNOWLEDGED]
        assert not r.xpending(K.requests, "test")["pending"]
    finally:
        stop(worker)


def test_the_attempt_is_counted_by_the_round_after_the_lookups(redis_server, r):
    """ADMITTED once the lookups' replies are in; RUNNING only once the HINCRBY's reply is in."""
    worker, trail = make_worker(redis_server.url)
    try:
        enqueue(r, {"id": "b", "prompt": "abc", "max_tokens": 50})
        tick_until(worker, lambda: "b" in trail)
        assert trail["b"] == [S.ADMITTED] and r.hget(K.attempts, "b") is None
        worker.tick()
        assert trail["b"] == [S.ADMITTED, S.RUNNING] and r.hget(K.attempts, "b") == b"1"
    finally:
        stop(worker)


def test_a_job_with_published_tokens_is_resumed(redis_server, r):
    r.xadd(K.out("c"), {EVENT_FIELD: json.dumps({"type": "token", "index": 0, "token_ids": [97]})}, id="0-1")
    worker, trail = make_worker(redis_server.url)
    try:
        enqueue(r, {"id": "c", "prompt": "abc", "max_tokens": 3})
        tick_until(worker, lambda: trail.get("c", [])[-1:] == [S.ACKNOWLEDGED])
        assert trail["c"] == [S.RESUMED, S.RUNNING, S.FINISHED, S.ACKNOWLEDGED]
    finally:
        stop(worker)


def test_a_malformed_entry_is_refused_then_acknowledged(redis_server, r):
    worker, trail = make_worker(redis_server.url)
    try:
        entry = r.xadd(K.requests, {JOB_FIELD: b"not json"})
        tick_until(worker, lambda: trail.get(entry, [])[-1:] == [S.ACKNOWLEDGED])
        assert trail[entry] == [S.REFUSED, S.ACKNOWLEDGED] and r.xlen(K.dead) == 1
    finally:
        stop(worker)


def test_an_id_that_finished_before_is_a_duplicate_and_acknowledged_unanswered(redis_server, r):
    worker, trail = make_worker(redis_server.url)
    try:
        enqueue(r, {"id": "d", "prompt": "abc", "max_tokens": 2})
        tick_until(worker, lambda: trail.get("d", [])[-1:] == [S.ACKNOWLEDGED])
        events = r.xlen(K.out("d"))
        enqueue(r, {"id": "d", "prompt": "abc", "max_tokens": 2})
        tick_until(worker, lambda: trail["d"][-2:] == [S.DUPLICATE, S.ACKNOWLEDGED])
        assert r.xlen(K.out("d")) == events and not r.xpending(K.requests, "test")["pending"]
    finally:
        stop(worker)

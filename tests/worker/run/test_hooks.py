"""Tests' and benchmarks' hooks (run/hooks.py): a Tracer sees every token event and publish latency; the
fault hook is armed only by the environment; production holds the no-op hooks."""

from __future__ import annotations

import threading

import pytest

from tests.helpers.worker_fakes import FakeEngine
from worker.client import collect, enqueue
from worker.config import WorkerConfig
from worker.connection import connect
from worker.run import fault_injection
from worker.run.hooks import NO_HOOKS, TokenTrace, Tracer
from worker.run.loop import Worker


@pytest.mark.redis
@pytest.mark.timeout(60)
def test_a_tracer_records_each_token_event_and_publish_latency(redis_server, r):
    tracer = Tracer()
    cfg = WorkerConfig(group="test", consumer="t")
    worker = Worker(FakeEngine(), connect(redis_server.url), cfg, hooks=tracer)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        enqueue(r, {"id": "a", "prompt": "x", "max_tokens": 5})
        enqueue(r, {"id": "b", "prompt": "y", "max_tokens": 3, "n": 2, "seed": 1, "temperature": 1.0})
        collect(r, "a", timeout_s=10)
        collect(r, "b", timeout_s=10)
    finally:
        worker.stop.request()
        thread.join(timeout=30)
    assert {(t.job_id, t.sample, t.first_index) for t in tracer.trace} == (
        {("a", 0, i) for i in range(5)} | {("b", k, i) for k in range(2) for i in range(3)}
    )
    assert all(isinstance(t, TokenTrace) and t.sampled_wall_s > 0 for t in tracer.trace)
    assert tracer.publish_latencies and min(tracer.publish_latencies) >= 0
    assert not hasattr(worker, "trace") and not hasattr(worker, "publish_latencies")


def test_a_worker_holds_the_no_op_hooks_unless_given_others():
    worker = Worker(FakeEngine(), connect("redis://127.0.0.1:1"), WorkerConfig(group="g", consumer="c"))
    assert worker.hooks is NO_HOOKS
    worker.shutdown()


def test_only_the_environment_arms_the_fault(monkeypatch):
    monkeypatch.delenv("CONVEYOR_TEST_KILL_JOB", raising=False)
    assert fault_injection.from_env() is NO_HOOKS
    monkeypatch.setenv("CONVEYOR_TEST_KILL_JOB", "poison")
    armed = fault_injection.from_env()
    assert isinstance(armed, fault_injection.KillOnJob) and armed.job_id == "poison"

"""Worker processes (`conveyor worker`) with the real engine: sharing, SIGTERM drain, crash and resume."""

from __future__ import annotations

import collections
import signal

import pytest

from tests.helpers.waiting import wait_until
from tests.helpers.worker_fakes import log_lines, real_engine, spawn_worker
from worker.client import collect, enqueue
from worker.keys import Keys

pytestmark = [pytest.mark.redis]
K = Keys()


def stop(proc) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=60)


@pytest.mark.timeout(180)
def test_two_workers_share_40_jobs(redis_server, r, tiny_model, tmp_path):
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    procs = [
        spawn_worker(redis_server.url, tiny_model, name, log) for name, log in zip("ab", logs, strict=True)
    ]
    try:
        wait_until(
            lambda: len(r.xinfo_consumers(K.requests, "test")) == 2 if r.exists(K.requests) else False,
            60,
            "workers",
        )
        for k in range(40):
            enqueue(r, {"id": f"j{k}", "prompt": f"job number {k}", "max_tokens": 24, "temperature": 0})
        results = {f"j{k}": collect(r, f"j{k}", timeout_s=120) for k in range(40)}
    finally:
        codes = [stop(p) for p in procs]
    assert codes == [0, 0]
    for events in results.values():
        assert sum(e["type"] == "done" for e in events) == 1 and events[-1]["type"] == "done"
        indices = [e["index"] for e in events if e["type"] == "token"]
        assert indices == list(range(len(indices)))
    finished = [[e["request_id"] for e in log_lines(log) if e.get("event") == "job finished"] for log in logs]
    counts = collections.Counter(finished[0] + finished[1])
    assert set(counts) == set(results) and set(counts.values()) == {1}, "a job was lost or ran twice"
    assert finished[0] and finished[1], "both workers should have done work"
    assert r.xpending(K.requests, "test")["pending"] == 0


@pytest.mark.timeout(120)
def test_sigterm_drains_in_flight_and_leaves_the_rest(redis_server, r, tiny_model, tmp_path):
    proc = spawn_worker(redis_server.url, tiny_model, "drainer", tmp_path / "w.log", "--max-num-seqs", "1")
    try:
        enqueue(
            r, {"id": "long", "prompt": "drain me", "max_tokens": 300, "ignore_eos": True, "temperature": 0}
        )
        wait_until(lambda: r.xlen(K.out("long")) >= 2, 60, "first tokens")
        enqueue(r, {"id": "queued", "prompt": "later", "max_tokens": 4})
        proc.send_signal(signal.SIGTERM)
        events = collect(r, "long", timeout_s=60)
        assert proc.wait(timeout=60) == 0
    finally:
        stop(proc)
    assert events[-1]["finish_reason"] == "length" and events[-1]["usage"]["completion_tokens"] == 300
    assert not r.exists(K.out("queued"))
    info = r.xinfo_groups(K.requests)[0]
    assert info["lag"] + info["pending"] == 1, "the queued job stays for another worker"


@pytest.mark.timeout(120)
def test_second_signal_exits_at_once_and_another_worker_resumes(redis_server, r, tiny_model, tmp_path):
    """Cold stop mid-job, then a second worker claims it after the lease and continues the same stream."""
    from engine import SamplingParams

    job = {
        "id": "rz",
        "prompt": "resume across workers",
        "max_tokens": 400,
        "ignore_eos": True,
        "temperature": 0,
    }
    first = spawn_worker(redis_server.url, tiny_model, "first", tmp_path / "1.log", "--lease-ms", "1000")
    try:
        enqueue(r, job)
        wait_until(lambda: r.xlen(K.out("rz")) >= 5, 60, "first tokens")
        first.send_signal(signal.SIGTERM)
        # Two identical pending signals would be delivered as one: the second goes once the first is seen.
        wait_until(
            lambda: any(e.get("event") == "draining: no new jobs" for e in log_lines(tmp_path / "1.log")),
            30,
            "the drain",
        )
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=30) == 0
    finally:
        stop(first)
    partial = r.xlen(K.out("rz"))
    assert partial < 401, "the job should not have finished before the cold stop"
    second = spawn_worker(redis_server.url, tiny_model, "second", tmp_path / "2.log", "--lease-ms", "1000")
    try:
        events = collect(r, "rz", timeout_s=90)
    finally:
        stop(second)
    indices = [e["index"] for e in events if e["type"] == "token"]
    assert indices == sorted(set(indices)) and indices[0] == 0
    tokens = [t for e in events if e["type"] == "token" for t in e["token_ids"]]
    direct = real_engine(tiny_model).generate(
        [job["prompt"]], SamplingParams(max_tokens=400, ignore_eos=True, temperature=0)
    )
    assert tokens == direct[0].token_ids and events[-1]["text"] == direct[0].text
    assert any(e.get("event") == "job resumed" for e in log_lines(tmp_path / "2.log"))
    assert r.xpending(K.requests, "test")["pending"] == 0

"""Redis full (noeviction), Redis gone while stopping, and two workers under one consumer name."""

from __future__ import annotations

import threading

import pytest
import redis
import structlog

from tests.helpers.worker_fakes import FakeEngine, log_lines, running_worker, spawn_worker, wait_until
from worker.client import collect, enqueue
from worker.config import WorkerConfig
from worker.connection import connect
from worker.keys import Keys
from worker.run.consumer_lease import ConsumerNameTaken
from worker.run.loop import Worker

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]
K = Keys()


def make_full(client: redis.Redis) -> None:
    """Redis full under noeviction: maxmemory below what it uses, so every write that needs memory is
    refused with OOM (filling it with data leaves a margin that comes and goes as buffers are freed)."""
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory", used // 2)
    with pytest.raises(redis.OutOfMemoryError):
        client.set("probe", b"x")


def fill(client: redis.Redis) -> None:
    """Redis full as a user fills it: values written until one is refused, so the server sits at its limit
    (small writes may still fit now and then as buffers are freed; a larger one does not)."""
    client.config_set("maxmemory", int(client.info("memory")["used_memory"]) + (4 << 20))
    k = 0
    while True:
        try:
            client.set(f"fill:{k}", b"x" * 1024)
        except redis.OutOfMemoryError:
            return
        k += 1


def token_indices(events: list[dict]) -> list[int]:
    return [
        i for e in events if e["type"] == "token" for i in range(e["index"], e["index"] + len(e["token_ids"]))
    ]


def test_a_full_redis_holds_in_flight_jobs_and_resumes_when_it_has_room(own_server):
    server = own_server("--maxmemory", "64mb", "--maxmemory-policy", "noeviction")
    client = connect(server.url)
    engine = FakeEngine(step_s=0.01)
    with (
        structlog.testing.capture_logs() as logs,
        running_worker(engine, server.url, lease_ms=60_000) as worker,
    ):
        for k in range(3):
            enqueue(client, {"id": f"m{k}", "prompt": "x", "max_tokens": 400})
        wait_until(lambda: all(client.xlen(K.out(f"m{k}")) >= 3 for k in range(3)), 30, "tokens of every job")
        make_full(client)
        wait_until(lambda: worker.lanes[0].health.is_full, 30, "the worker to see Redis full")
        retries = worker.metrics.redis_full_retries
        wait_until(lambda: retries._value.get() >= 3, 30, "retries with back-off while full")
        assert worker.metrics.redis_full._value.get() == 1
        assert engine.has_unfinished_requests(), "in-flight jobs are kept"
        client.config_set("maxmemory", "64mb")
        results = [collect(client, f"m{k}", timeout_s=60) for k in range(3)]
        assert worker.metrics.redis_full._value.get() == 0
    for events in results:
        assert events[-1]["type"] == "done" and events[-1]["usage"]["completion_tokens"] == 400
        assert token_indices(events) == list(range(400)), "events retried, none lost or doubled"
    said = [e["event"] for e in logs]
    assert any(s.startswith("redis is full") for s in said) and "redis has room again: resuming" in said


@pytest.mark.parametrize("signals", [1, 2])
def test_a_stop_while_redis_is_down_ends_cleanly_within_the_drain_timeout(own_server, signals):
    server = own_server()
    client = connect(server.url)
    cfg = WorkerConfig(group="test", consumer="w1", lease_ms=3000, drain_timeout_s=1.0)
    worker = Worker(FakeEngine(step_s=0.01), connect(server.url), cfg)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            worker.run()
        except BaseException as exc:  # what would make the process exit 1
            failure.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    with structlog.testing.capture_logs() as logs:
        thread.start()
        enqueue(client, {"id": "d", "prompt": "x", "max_tokens": 400})
        wait_until(lambda: client.xlen(K.out("d")) >= 3, 30, "tokens")
        server.stop()
        wait_until(lambda: any(e["event"] == "redis unavailable, retrying" for e in logs), 30, "a retry")
        for _ in range(signals):
            worker.stop.request()
        thread.join(timeout=30)
    assert not thread.is_alive(), "the stop was not bounded by the drain timeout"
    assert failure == [], f"a clean stop raised {failure}"
    assert any(e["event"] == "worker stopped" for e in logs)


def test_a_second_worker_under_the_same_consumer_name_refuses_to_start(redis_server, r):
    with running_worker(FakeEngine(), redis_server.url, lease_ms=300):
        wait_until(lambda: r.exists("conveyor:consumer:test:w1"), 10, "the first worker to take its name")
        twin = Worker(
            FakeEngine(), connect(redis_server.url), WorkerConfig(group="test", consumer="w1", lease_ms=300)
        )
        with pytest.raises(ConsumerNameTaken, match="'w1'.*in use by another live worker"):
            twin.run()
    # Once the first one stopped (and released the name), the name is free again.
    with running_worker(FakeEngine(), redis_server.url, lease_ms=300):
        enqueue(r, {"id": "after", "prompt": "x", "max_tokens": 3})
        assert collect(r, "after", timeout_s=10)[-1]["type"] == "done"


def test_a_crashed_workers_name_is_taken_once_its_lease_lapses(redis_server, r):
    """kill -9 leaves the name's lease behind; a restart under that name waits for it instead of refusing."""
    key = "conveyor:consumer:test:w1"
    r.set(key, "a-dead-process", px=60_000)
    with (
        structlog.testing.capture_logs() as logs,
        running_worker(FakeEngine(), redis_server.url, lease_ms=500),
    ):
        waiting = "consumer name leased by another worker; waiting for its lease to lapse"
        wait_until(lambda: any(e["event"] == waiting for e in logs), 10, "the worker to wait for the name")
        r.pexpire(key, 100)  # the dead process's lease runs out
        enqueue(r, {"id": "j", "prompt": "x", "max_tokens": 3})
        assert collect(r, "j", timeout_s=10)[-1]["type"] == "done"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("lanes", [(), ("--tenant-weight", "a=2")], ids=["plain", "tenant-lanes"])
def test_a_worker_started_on_a_full_redis_waits_and_then_finishes_every_job(
    own_server, tiny_model, tmp_path, lanes
):
    """docs/operations.md: a full Redis is survived, also by a worker that starts while it is full. Its
    start-up writes (the lane layout, the consumer name, the registry record) wait for room instead of
    ending it with an OutOfMemoryError."""
    server = own_server("--maxmemory", "64mb", "--maxmemory-policy", "noeviction")
    client = connect(server.url)
    ids = [f"f{k}" for k in range(20)]
    for job_id in ids:
        enqueue(client, {"id": job_id, "prompt": "x", "max_tokens": 4})
    fill(client)
    log = tmp_path / "worker.log"
    proc = spawn_worker(server.url, tiny_model, "full1", log, *lanes)
    try:
        said = lambda: {line.get("event") for line in log_lines(log)}  # noqa: E731
        wait_until(lambda: proc.poll() is not None or any(s and "full" in s for s in said()), 90, "full seen")
        threading.Event().wait(2)  # a few heartbeat intervals while full
        assert proc.poll() is None, f"the worker died on a full Redis: {log.read_text()[-2000:]}"
        client.delete(*client.keys("fill:*"))
        results = [collect(client, job_id, timeout_s=60) for job_id in ids]
        assert all(events[-1]["type"] == "done" for events in results)
        wait_until(
            lambda: client.exists(K.worker("full1")), 10, "the worker in the registry once there is room"
        )
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(timeout=30)

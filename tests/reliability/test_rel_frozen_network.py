"""Issue 20, item 6: a frozen network between worker and Redis (tests/helpers/fault_proxy.py). A stop is
bounded by the drain timeout even when Redis connections hang instead of refusing; jobs stay exactly once
under every fault mode, and the worker and its clients recover by themselves once the fault clears."""

from __future__ import annotations

import signal
import threading

import pytest
import redis
import structlog

from tests.helpers.fault_proxy import FaultProxy
from tests.helpers.worker_fakes import FakeEngine, log_lines, on_a_thread, spawn_worker, wait_until
from worker import local_redis
from worker.client import collect, enqueue
from worker.config import WorkerConfig
from worker.connection import connect
from worker.keys import Keys
from worker.run.loop import Worker

pytestmark = [pytest.mark.redis, pytest.mark.timeout(90)]
K = Keys()
TOKENS = 60


@pytest.fixture
def server():
    if local_redis.redis_server_path() is None:
        pytest.skip("redis-server is not installed")
    started = local_redis.start()
    yield started
    started.stop()


@pytest.fixture
def proxy(server):
    with FaultProxy(server.port) as p:
        yield p


def token_indices(events: list[dict]) -> list[int]:
    return [
        i for e in events if e["type"] == "token" for i in range(e["index"], e["index"] + len(e["token_ids"]))
    ]


@pytest.mark.parametrize("busy", [True, False], ids=["in-flight job", "idle"])
def test_a_stop_is_bounded_by_the_drain_timeout_while_redis_hangs(server, proxy, busy):
    """The worker's sockets wait 30 s for a reply (the default); the drain timeout is 1 s."""
    direct = connect(server.url)
    cfg = WorkerConfig(group="test", consumer="w1", lease_ms=3000, drain_timeout_s=1.0)
    worker = Worker(FakeEngine(step_s=0.05), connect(proxy.url()), cfg)
    failures: list[BaseException] = []

    def run() -> None:
        try:
            worker.run()
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    with structlog.testing.capture_logs() as logs:
        thread.start()
        wait_until(lambda: any(e["event"] == "worker started" for e in logs), 10, "the worker to start")
        if busy:
            enqueue(direct, {"id": "long", "prompt": "x", "max_tokens": 500})
            wait_until(lambda: direct.xlen(K.out("long")) >= 3, 10, "tokens")
        proxy.set("stall")
        worker.stop.request()
        thread.join(timeout=10)  # far below the 30 s socket timeout
    assert not thread.is_alive(), "the stop waited for the socket timeout, not the drain timeout"
    assert failures == [], failures
    assert any(e["event"] == "worker stopped" for e in logs)


@pytest.mark.parametrize("mode", ["latency", "stall", "reset", "blackhole"])
def test_jobs_stay_exactly_once_under_a_fault_and_everyone_recovers(server, proxy, mode):
    direct = connect(server.url)
    # Small socket timeouts (an option), so that a frozen connection is given up in about a second.
    worker_client = connect(proxy.url(), socket_timeout=1.0)
    client = redis.Redis.from_url(proxy.url(), socket_timeout=1.0, socket_connect_timeout=1.0)
    cfg = WorkerConfig(group="test", consumer="w1", lease_ms=3000)
    engine = FakeEngine(step_s=0.02)
    ids = [f"{mode}{k}" for k in range(4)]
    results: dict[str, list[dict]] = {}

    def follow(job_id: str) -> None:
        results[job_id] = collect(client, job_id, timeout_s=60)

    with on_a_thread(Worker(engine, worker_client, cfg)):
        for job_id in ids:
            enqueue(direct, {"id": job_id, "prompt": job_id, "max_tokens": TOKENS})
        readers = [threading.Thread(target=follow, args=(j,), daemon=True) for j in ids]
        for reader in readers:
            reader.start()
        wait_until(lambda: all(direct.xlen(K.out(j)) >= 3 for j in ids), 20, "tokens of every job")
        proxy.set(mode, latency_s=0.05)
        threading.Event().wait(2.0)  # the fault lasts two seconds (longer than the socket timeouts)
        proxy.set("pass")
        for reader in readers:
            reader.join(timeout=60)
        assert all(not r.is_alive() for r in readers), "a client did not recover"
        enqueue(direct, {"id": f"{mode}-after", "prompt": "z", "max_tokens": 3})
        assert collect(direct, f"{mode}-after", timeout_s=20)[-1]["type"] == "done", "worker recovered"
    for job_id in ids:
        events = results[job_id]
        assert [e["type"] for e in events].count("done") == 1 and events[-1]["type"] == "done"
        assert token_indices(events) == list(range(TOKENS)), "an event lost or doubled"
        assert events[-1]["text"] == engine.expected_text(job_id, TOKENS)
        stream = [e for _, e in direct.xrange(K.out(job_id))]
        assert len(stream) == len(events), "the stream holds one history"
    assert direct.xpending(K.requests, "test")["pending"] == 0, "every job acknowledged"


@pytest.mark.timeout(180)
def test_sigterm_to_a_worker_process_on_a_frozen_network_exits_within_the_drain_bound(
    server, proxy, tiny_model, tmp_path
):
    """The issue's case: `conveyor worker --drain-timeout 2` (30 s socket timeout), SIGTERM while its
    connections are frozen; it exits within the drain bound plus the 2 s last write, not the 30 s."""
    direct = connect(server.url)
    log = tmp_path / "w.log"
    proc = spawn_worker(proxy.url(), tiny_model, "frozen", log, "--drain-timeout", "2")
    try:
        job = {"id": "long", "prompt": "frozen", "max_tokens": 400, "ignore_eos": True, "temperature": 0}
        enqueue(direct, job)
        wait_until(lambda: direct.xlen(K.out("long")) >= 2, 120, "first tokens")
        proxy.set("stall")
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=15)  # the socket timeout (30 s) would end it later
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 0
    said = [e.get("event") for e in log_lines(log)]
    assert "stopping while Redis is unavailable or full" in said and "worker stopped" in said

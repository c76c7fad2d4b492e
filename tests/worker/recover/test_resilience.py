"""Redis going away and coming back, and the metrics endpoint."""

from __future__ import annotations

import urllib.request

import pytest
import structlog

from tests.helpers.worker_fakes import FakeEngine, running_worker, wait_until
from worker import local_redis
from worker.cli.metrics_listener import bind_metrics
from worker.client import collect, enqueue
from worker.connection import connect

pytestmark = [pytest.mark.redis, pytest.mark.timeout(90)]


def scrape(port: int, needle: str) -> str | None:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return body if needle in body else None


def test_worker_survives_a_redis_restart():
    if local_redis.redis_server_path() is None:
        pytest.skip("redis-server is not installed")
    server = local_redis.start()
    try:
        with structlog.testing.capture_logs() as logs, running_worker(FakeEngine(), server.url, block_ms=200):
            client = connect(server.url)
            enqueue(client, {"id": "before", "prompt": "x", "max_tokens": 3})
            assert collect(client, "before", timeout_s=10)[-1]["type"] == "done"
            server.stop()
            wait_until(lambda: any(e["event"] == "redis unavailable, retrying" for e in logs), 10, "a retry")
            server = local_redis.start(port=server.port)  # empty: no persistence, the group is gone
            client = connect(server.url)
            enqueue(client, {"id": "after", "prompt": "x", "max_tokens": 3})
            assert collect(client, "after", timeout_s=30)[-1]["type"] == "done"
        events = [entry["event"] for entry in logs]
        assert "redis unavailable, retrying" in events and "redis reachable again" in events
    finally:
        server.stop()


def test_metrics_endpoint(redis_server, r):
    port = local_redis.free_port()
    with running_worker(FakeEngine(), redis_server.url, lease_ms=300) as worker:
        listener = bind_metrics("127.0.0.1", port, explicit=True)
        assert listener is not None
        listener.serve(worker.metrics.registry)
        enqueue(r, {"id": "m1", "prompt": "x", "max_tokens": 3})
        collect(r, "m1", timeout_s=10)
        body = wait_until(lambda: scrape(port, 'outcome="length"'), 10, "the job's outcome in /metrics")
    for name in (
        "conveyor_queue_depth",
        "conveyor_running_requests",
        "conveyor_waiting_requests",
        "conveyor_kv_blocks_used",
        "conveyor_tokens_per_second",
        "conveyor_time_to_first_token_seconds",
        "conveyor_time_per_output_token_seconds",
        "conveyor_queue_time_seconds",
    ):
        assert name in body, name
    assert 'conveyor_jobs_total{consumer="w1",outcome="length"} 1.0' in body

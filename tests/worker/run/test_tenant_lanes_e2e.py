"""Issue 43 row 16 end to end: `conveyor worker --tenant-weight a=2` and `conveyor serve` with a key per
tenant. A tenant no worker option names, first seen at run time, gets a lane of its own: the gateway
writes its job to `<requests>:t:<tenant>` and adds it to `<requests>:tenants`; the worker adds the lane
within a registry interval and answers, with no restart, and lists the lane in its registry record."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.helpers.gateway import spawn_gateway
from tests.helpers.worker_fakes import spawn_worker, wait_until
from worker.fleet import registry
from worker.keys import Keys

pytestmark = [pytest.mark.redis, pytest.mark.timeout(180)]
K = Keys()


def test_a_tenant_first_seen_through_the_gateway_gets_its_own_lane(redis_server, r, tiny_model, tmp_path):
    r.flushall()
    worker = spawn_worker(
        redis_server.url,
        tiny_model,
        "tw",
        tmp_path / "w.log",
        "--tenant-weight",
        "a=2",
        "--registry-interval",
        "0.5",
    )
    gateway = None
    try:
        wait_until(lambda: registry.live(registry.read(r, K)), 90, "the worker in the registry")
        (record,) = registry.live(registry.read(r, K))
        keys = ["--api-key", "a=sk-a", "--api-key", "newcomer=sk-new"]
        gateway = spawn_gateway(redis_server.url, tmp_path, *keys)
        body = {"model": record.model, "prompt": "Once upon a time", "max_tokens": 4}
        answer = httpx.post(
            f"{gateway.base_url}/completions",
            json=body,
            headers={"Authorization": "Bearer sk-new"},
            timeout=60,
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] == 4
        assert r.xlen("conveyor:requests:t:newcomer") == 1 and r.xlen("conveyor:requests") == 0
        assert r.smembers("conveyor:requests:tenants") == {b"newcomer"}
        wait_until(
            lambda: "conveyor:requests:t:newcomer" in registry.live(registry.read(r, K))[0].streams,
            5,
            "the new lane in the worker's record",
        )
        said = [
            json.loads(line) for line in (tmp_path / "w.log").read_text().splitlines() if line.startswith("{")
        ]
        assert any(e.get("event") == "tenant lane added" and e.get("tenant") == "newcomer" for e in said)
        assert worker.poll() is None
    finally:
        if gateway is not None:
            gateway.stop()
        worker.terminate()
        worker.wait(timeout=30)

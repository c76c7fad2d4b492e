"""/v1/files and /v1/batches through `conveyor serve` processes, with the real `openai` SDK, a real worker on
the tiny model and a real redis-server: 200 lines run to completed while the replica driving them is killed
with -9 (the other replica continues, each custom_id answered once); cancel; expiry; errors; tenants."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.helpers.paused import paused
from tests.helpers.rel_helpers import Workers
from tests.helpers.waiting import wait_until
from worker.keys import Keys
from worker.local_redis import free_port

pytestmark = [pytest.mark.redis, pytest.mark.timeout(300)]
ROOT = str(Path(__file__).resolve().parents[3])
K = Keys()
KEYS = {"alice": "key-alice", "bob": "key-bob"}


@dataclass
class Replica:
    url: str
    process: subprocess.Popen

    def client(self, tenant: str = "alice"):
        from openai import OpenAI

        return OpenAI(base_url=self.url + "/v1", api_key=KEYS[tenant], max_retries=0, timeout=30)


def _serve(redis_url: str, log: Path, *extra: str) -> Replica:
    port = free_port()
    args = [sys.executable, "-m", "worker.cli", "serve", "--redis-url", redis_url, "--port", str(port)]
    for tenant, key in KEYS.items():
        args += ["--api-key", f"{tenant}={key}"]
    args += ["--batch-lease-ms", "1500", "--batch-poll-s", "0.2", "--batch-drain-s", "0.5", *extra]
    env = {**os.environ, "PYTHONPATH": ROOT, "PYTHONUNBUFFERED": "1"}
    env.pop("CONVEYOR_API_KEYS", None)
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=open(log, "wb"))
    replica = Replica(f"http://127.0.0.1:{port}", proc)

    def up() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"gateway exited: {log.read_text()[-2000:]}")
        try:
            return httpx.get(replica.url + "/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(up, 60, "the gateway to answer /health", 0.1)
    return replica


@pytest.fixture(scope="module")
def batch_worker(redis_server, tiny_model, tmp_path_factory):
    """The one worker behind the replicas."""
    workers = Workers(tiny_model, tmp_path_factory.mktemp("worker_logs"))
    try:
        worker = workers.spawn(redis_server.url, "w1", "--served-model-name", "tiny")
        worker.wait_started()
        yield worker
    finally:
        workers.stop_all()


@pytest.fixture(scope="module")
def deployment(redis_server, batch_worker, tmp_path_factory):
    logs = tmp_path_factory.mktemp("gateway_logs")
    replicas: list[Replica] = []
    try:
        replicas += [
            _serve(redis_server.url, logs / f"gw{i}.log", "--max-file-bytes", "400000") for i in range(2)
        ]
        yield replicas
    finally:
        for r in replicas:
            if r.process.poll() is None:
                r.process.send_signal(signal.SIGTERM)
        for r in replicas:
            try:
                r.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                r.process.kill()
                r.process.wait(timeout=10)


def _lines(n: int, max_tokens: int = 3, prefix: str = "r", model: str = "tiny") -> bytes:
    out = []
    for i in range(n):
        body = {
            "model": model,
            "messages": [{"role": "user", "content": f"say {i}"}],
            "max_tokens": max_tokens,
        }
        out.append(
            json.dumps(
                {"custom_id": f"{prefix}{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}
            )
        )
    return ("\n".join(out) + "\n").encode()


def _final(client, batch_id: str, timeout_s: float = 180):
    def done():
        b = client.batches.retrieve(batch_id)
        return b if b.status in ("completed", "failed", "cancelled", "expired") else None

    return wait_until(done, timeout_s, f"batch {batch_id} to end", 0.2)


def test_200_lines_survive_the_kill_of_their_replica(deployment, redis_server):
    import redis
    from openai.types.chat import ChatCompletion

    first, second = deployment
    client = first.client()
    uploaded = client.files.create(file=("batch.jsonl", io.BytesIO(_lines(200))), purpose="batch")
    assert (uploaded.purpose, uploaded.bytes) == ("batch", len(_lines(200)))
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert batch.status == "validating" and batch.input_file_id == uploaded.id
    # Kill -9 whichever replica holds the batch's lease once some lines are answered.
    r = redis.Redis.from_url(redis_server.url)
    wait_until(
        lambda: client.batches.retrieve(batch.id).request_counts.completed >= 20,
        120,
        "20 lines answered",
        0.05,
    )
    holder = r.get(K.batch(batch.id, "lease"))
    assert holder is not None
    pid = int(holder.decode().split(":")[0].rsplit("-", 1)[1])
    driving = next(x for x in deployment if x.process.pid == pid)
    survivor = second if driving is first else first
    driving.process.send_signal(signal.SIGKILL)
    driving.process.wait(timeout=10)
    at_kill = survivor.client().batches.retrieve(batch.id).request_counts
    assert at_kill is not None and at_kill.completed < 200, "the batch ended before the kill"
    done = _final(survivor.client(), batch.id)
    assert done.status == "completed" and done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (
        200,
        200,
        0,
    )
    assert done.error_file_id is None and done.output_file_id is not None
    lines = [json.loads(x) for x in survivor.client().files.content(done.output_file_id).text.splitlines()]
    assert Counter(x["custom_id"] for x in lines) == Counter({f"r{i}": 1 for i in range(200)})
    for x in lines:
        assert x["error"] is None and x["response"]["status_code"] == 200
        ChatCompletion.model_validate(x["response"]["body"])
    listed = [b.id for b in survivor.client().batches.list()]
    assert batch.id in listed


def test_cancel_expiry_errors_and_tenants(deployment, batch_worker):
    import openai

    alive = next(x for x in deployment if x.process.poll() is None)
    alice, bob = alive.client("alice"), alive.client("bob")
    with pytest.raises(openai.BadRequestError):
        alice.files.create(file=("x.jsonl", io.BytesIO(b"{}\n")), purpose="fine-tune")
    with pytest.raises(openai.APIStatusError) as info:
        alice.files.create(file=("big.jsonl", io.BytesIO(b"x" * 400_001)), purpose="batch")
    assert info.value.status_code == 413
    with pytest.raises(openai.NotFoundError):
        alice.batches.create(
            input_file_id="file-nope", endpoint="/v1/chat/completions", completion_window="24h"
        )
    with pytest.raises(openai.BadRequestError):
        f = alice.files.create(file=("a.jsonl", io.BytesIO(_lines(1))), purpose="batch")
        alice.batches.create(input_file_id=f.id, endpoint="/v1/embeddings", completion_window="24h")
    with pytest.raises(openai.AuthenticationError):
        alive.client().with_options(api_key="wrong").files.list()

    # A long batch (many tokens per line), cancelled while the worker is frozen, so that lines are left to
    # cancel however fast the worker is: it ends cancelled; what ran is in the output file.
    f = alice.files.create(
        file=("c.jsonl", io.BytesIO(_lines(40, max_tokens=200, prefix="c"))), purpose="batch"
    )
    b = alice.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    # Bob sees none of Alice's files or batches.
    for call in (
        lambda: bob.files.retrieve(f.id),
        lambda: bob.files.content(f.id),
        lambda: bob.batches.retrieve(b.id),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    assert f.id not in [x.id for x in bob.files.list()] and b.id not in [x.id for x in bob.batches.list()]
    with pytest.raises(openai.NotFoundError):
        bob.batches.cancel(b.id)
    wait_until(lambda: alice.batches.retrieve(b.id).status == "in_progress", 60, "in_progress", 0.05)
    with paused(batch_worker.process.pid):
        assert alice.batches.cancel(b.id).status in ("cancelling", "cancelled")
    c = _final(alice, b.id, 60)
    assert c.status == "cancelled" and c.request_counts is not None and c.request_counts.total == 40
    assert c.request_counts.completed + c.request_counts.failed == 40 and c.request_counts.failed > 0
    assert c.error_file_id is not None
    codes = {
        json.loads(x)["error"]["code"]
        if json.loads(x)["error"]
        else json.loads(x)["response"]["body"]["error"]["code"]
        for x in alice.files.content(c.error_file_id).text.splitlines()
    }
    assert codes <= {"batch_cancelled", "cancel"}
    # A line for a model nobody serves is answered model_not_found; the batch completes.
    content = _lines(1, prefix="d") + _lines(1, prefix="nope", model="nope")
    d = alice.batches.create(
        input_file_id=alice.files.create(file=("d.jsonl", io.BytesIO(content)), purpose="batch").id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    d = _final(alice, d.id, 60)
    assert d.status == "completed" and d.error_file_id is not None
    (unknown,) = [json.loads(x) for x in alice.files.content(d.error_file_id).text.splitlines()]
    assert (unknown["custom_id"], unknown["error"]["code"]) == ("nope0", "model_not_found")
    with pytest.raises(openai.ConflictError):  # final: not cancellable
        alice.batches.cancel(d.id)

    # A 2-second window that passes while the worker is frozen: the batch expires, however fast the worker is.
    f = alice.files.create(
        file=("e.jsonl", io.BytesIO(_lines(40, max_tokens=200, prefix="e"))), purpose="batch"
    )
    with paused(batch_worker.process.pid):
        e = alice.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="2s")
        wait_until(lambda: time.time() > e.expires_at + 0.5, 10, "the window to pass", 0.1)
    x = _final(alice, e.id, 60)
    assert x.status == "expired" and x.expired_at is not None and x.request_counts is not None
    assert x.request_counts.failed > 0 and x.request_counts.completed + x.request_counts.failed == 40

    # Files: list, retrieve, delete.
    assert f.id in [x.id for x in alice.files.list(purpose="batch")]
    assert alice.files.retrieve(f.id).filename == "e.jsonl"
    assert alice.files.delete(f.id).deleted
    with pytest.raises(openai.NotFoundError):
        alice.files.retrieve(f.id)


def test_without_api_keys_one_tenant_and_jobs_carry_none(redis_server):
    import redis
    from fastapi.testclient import TestClient

    from worker.batch.api_config import BatchApiConfig
    from worker.gateway.app import create_app
    from worker.gateway.settings import GatewaySettings
    from worker.keys import requests_stream_name

    r = redis.Redis.from_url(redis_server.url)
    r.flushall()
    # No worker is live, but the model's stream exists (its workers are restarting): jobs wait there.
    tiny_stream = requests_stream_name("conveyor", "tiny")
    r.xgroup_create(tiny_stream, "workers", mkstream=True)
    quick = BatchApiConfig(poll_s=0.1, drain_s=0.3)
    app = create_app(GatewaySettings(redis_url=redis_server.url, batches=quick))
    with TestClient(app) as http:
        up = http.post("/v1/files", files={"file": ("a.jsonl", _lines(2))}, data={"purpose": "batch"})
        assert up.status_code == 200 and up.json()["object"] == "file"
        body = {
            "input_file_id": up.json()["id"],
            "endpoint": "/v1/chat/completions",
            "completion_window": "1h",
        }
        batch = http.post("/v1/batches", json=body).json()
        wait_until(lambda: r.xlen(tiny_stream) == 2, 30, "the batch's 2 jobs enqueued", 0.05)
    job = json.loads(r.xrange(tiny_stream)[0][1][b"job"])
    assert "tenant" not in job and job["deadline_ms"] == batch["expires_at"] * 1000
    with TestClient(app) as http:  # the same app started again: its drivers too
        assert http.post(f"/v1/batches/{batch['id']}/cancel").json()["status"] == "cancelling"
        wait_until(
            lambda: http.get(f"/v1/batches/{batch['id']}").json()["status"] == "cancelled", 30, "cancelled"
        )
        too_big = http.post(
            "/v1/files", content=b"x" * 100, headers={"content-length": str(64 * 1024 * 1024 + 70 * 1024)}
        )
        assert too_big.status_code == 413

"""The durable batch driver (worker/batch/driver.py) on a real redis-server and a real worker on the tiny
model: a batch runs to completed; a driving replica killed with -9 mid-batch is taken over by another one and
every custom_id is answered exactly once, by one generation of its job; cancel; expiry; a file that fails
validation. No HTTP here: tests/worker/gateway has the same through the API and the openai SDK."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter

import pytest
from openai.types import Batch
from openai.types.chat import ChatCompletion

from tests.helpers.batch_replica import make_pool
from tests.helpers.rel_helpers import assert_exactly_once, read_events
from tests.helpers.waiting import wait_until
from tests.helpers.worker_fakes import real_engine, running_worker
from worker.batch.batch_store import BatchStore
from worker.batch.driver import batch_job_id
from worker.batch.file_store import FileStore
from worker.keys import Keys

pytestmark = [pytest.mark.redis, pytest.mark.timeout(300)]
K = Keys()
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


@pytest.fixture(scope="module")
def engine(tiny_model):
    return real_engine(tiny_model)


def _line(custom_id: str, max_tokens: int = 4) -> str:
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": f"hi {custom_id}"}],
        "max_tokens": max_tokens,
    }
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body})


def _submit(
    r, lines: list[str], window: str = "24h", tenant: str = "t1", url: str = "/v1/chat/completions"
) -> str:
    f = FileStore(r, K).create(tenant, "in.jsonl", "batch", ("\n".join(lines) + "\n").encode())
    return BatchStore(r, K).create(tenant, f.id, url, window).id


def _wait_final(r, batch_id: str, timeout_s: float = 120, tenant: str = "t1"):
    store = BatchStore(r, K)

    def final():
        b = store.get(tenant, batch_id)
        return b if b is not None and b.status in ("completed", "failed", "cancelled", "expired") else None

    return wait_until(final, timeout_s, f"batch {batch_id} to end", 0.05)


def _file_lines(r, file_id: str | None, tenant: str = "t1") -> list[dict]:
    if file_id is None:
        return []
    content = FileStore(r, K).content(tenant, file_id)
    assert content is not None
    return [json.loads(x) for x in content.decode().splitlines()]


def test_a_batch_runs_to_completed(r, redis_server, engine):
    lines = [_line(f"r{i}") for i in range(12)] + [
        _line("tools").replace('"max_tokens"', '"tools": [1], "max_tokens"')
    ]
    batch_id = _submit(r, lines)
    pool = make_pool(redis_server.url, "replica-a", lease_ms=3000, max_in_flight=4)
    with running_worker(engine, redis_server.url):
        pool.start()
        try:
            b = _wait_final(r, batch_id)
        finally:
            pool.stop()
    Batch.model_validate(b.model_dump())
    assert b.status == "completed" and b.in_progress_at and b.finalizing_at and b.completed_at
    assert (b.request_counts.total, b.request_counts.completed, b.request_counts.failed) == (13, 12, 1)
    out, errors = _file_lines(r, b.output_file_id), _file_lines(r, b.error_file_id)
    assert sorted(x["custom_id"] for x in out) == sorted(f"r{i}" for i in range(12))
    for x in out:
        ChatCompletion.model_validate(x["response"]["body"])
        assert x["response"]["request_id"] == batch_job_id(batch_id, x["custom_id"])
    assert [(x["custom_id"], x["error"]["code"]) for x in errors] == [("tools", "unsupported_field")]
    # Finished: its working keys are gone, and no replica leases it any more.
    assert not r.exists(
        K.batch(batch_id, "answered"), K.batch(batch_id, "output"), K.batch(batch_id, "lease")
    )
    assert not r.sismember(K.batches_open, batch_id)


def test_completions_lines_with_echo_score_their_prompt(r, redis_server, engine):
    """echo + logprobs + max_tokens 0 (worker/openai/echo.py): the prompt's text and logprobs only."""
    prompt = [5, 17, 42, 9, 77]
    body = {"model": "tiny", "prompt": prompt, "echo": True, "logprobs": 1, "max_tokens": 0}
    line = json.dumps({"custom_id": "e", "method": "POST", "url": "/v1/completions", "body": body})
    batch_id = _submit(r, [line], url="/v1/completions")
    pool = make_pool(redis_server.url, "replica-e", lease_ms=3000, max_in_flight=4)
    with running_worker(engine, redis_server.url):
        pool.start()
        try:
            b = _wait_final(r, batch_id)
        finally:
            pool.stop()
    (out,) = _file_lines(r, b.output_file_id)
    answer = out["response"]["body"]
    choice = answer["choices"][0]
    logprobs = choice["logprobs"]
    assert len(logprobs["tokens"]) == len(prompt) and choice["text"] == "".join(logprobs["tokens"])
    assert logprobs["token_logprobs"][0] is None and all(lp < 0 for lp in logprobs["token_logprobs"][1:])
    assert choice["finish_reason"] == "length" and answer["usage"]["completion_tokens"] == 0


def test_killed_replica_is_taken_over_each_custom_id_once(r, redis_server, engine, tmp_path):
    n = 60
    batch_id = _submit(r, [_line(f"c{i}", max_tokens=6) for i in range(n)])
    env = {**os.environ, "PYTHONPATH": ROOT, "PYTHONUNBUFFERED": "1"}
    args = [sys.executable, "-m", "tests.helpers.batch_replica", redis_server.url, "replica-a", "1500", "8"]
    store = BatchStore(r, K)
    with running_worker(engine, redis_server.url):
        first = subprocess.Popen(
            args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "a.log", "wb")
        )
        try:
            wait_until(
                lambda: store.get("t1", batch_id).request_counts.completed >= 10, 120, "10 lines answered"
            )  # type: ignore[union-attr]
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=10)
        done_at_kill = store.get("t1", batch_id).request_counts.completed  # type: ignore[union-attr]
        assert done_at_kill < n, "the batch ended before the kill: nothing taken over"
        pool = make_pool(redis_server.url, "replica-b", lease_ms=1500, max_in_flight=8)
        pool.start()
        try:
            b = _wait_final(r, batch_id)
        finally:
            pool.stop()
    assert b.status == "completed" and b.request_counts.completed == n and b.request_counts.failed == 0
    out = _file_lines(r, b.output_file_id)
    assert Counter(x["custom_id"] for x in out) == Counter({f"c{i}": 1 for i in range(n)})
    for i in range(n):  # one generation per job: the re-enqueued ones were deduplicated by the workers
        job_id = batch_job_id(batch_id, f"c{i}")
        assert_exactly_once(job_id, read_events(r, job_id))


def test_cancel_answers_every_line_and_ends_cancelled(r, redis_server):
    # No worker: the jobs wait in the stream; a cancel stops the batch, every line gets batch_cancelled.
    batch_id = _submit(r, [_line(f"x{i}") for i in range(5)])
    pool = make_pool(redis_server.url, "replica-a", lease_ms=3000, drain_s=0.3)
    pool.start()
    try:
        store = BatchStore(r, K)
        wait_until(lambda: r.xlen(K.requests) == 5, 30, "the 5 jobs enqueued")
        assert store.cancel("t1", batch_id).status == "cancelling"  # type: ignore[union-attr]
        b = _wait_final(r, batch_id, 30)
    finally:
        pool.stop()
    assert b.status == "cancelled" and b.cancelled_at and b.output_file_id is None
    errors = _file_lines(r, b.error_file_id)
    assert sorted(x["custom_id"] for x in errors) == [f"x{i}" for i in range(5)]
    assert {x["error"]["code"] for x in errors} == {"batch_cancelled"}
    # The jobs in flight were cancelled for the workers too.
    assert r.exists(K.cancel(batch_job_id(batch_id, "x0")))


def test_completion_window_expires_the_batch(r, redis_server):
    batch_id = _submit(r, [_line(f"e{i}") for i in range(3)], window="2s")
    pool = make_pool(redis_server.url, "replica-a", lease_ms=3000, drain_s=0.3)
    pool.start()
    try:
        b = _wait_final(r, batch_id, 30)
    finally:
        pool.stop()
    assert b.status == "expired" and b.expired_at is not None and b.expired_at >= b.expires_at
    assert {x["error"]["code"] for x in _file_lines(r, b.error_file_id)} == {"batch_expired"}
    job = json.loads(r.xrange(K.requests)[0][1][b"job"])  # the jobs carried the window as their deadline
    assert job["deadline_ms"] == b.expires_at * 1000 and job["tenant"] == "t1"


def test_a_file_that_fails_validation_fails_the_batch(r, redis_server):
    lines = [
        _line("a"),
        _line("a"),
        "not json",
        _line("u").replace("/v1/chat/completions", "/v1/completions"),
    ]
    batch_id = _submit(r, lines)
    pool = make_pool(redis_server.url, "replica-a", lease_ms=3000)
    pool.start()
    try:
        b = _wait_final(r, batch_id, 30)
    finally:
        pool.stop()
    assert b.status == "failed" and b.failed_at and b.errors is not None
    assert [(e.code, e.line) for e in b.errors.data] == [
        ("duplicate_custom_id", 2),
        ("invalid_json_line", 3),
        ("mismatched_endpoint", 4),
    ]
    assert r.xlen(K.requests) == 0  # nothing ran


def test_a_stopping_replica_hands_its_batch_over_at_once(r, redis_server, engine):
    n = 40
    batch_id = _submit(r, [_line(f"h{i}", max_tokens=6) for i in range(n)])
    store = BatchStore(r, K)
    leaving = make_pool(
        redis_server.url, "replica-a", lease_ms=60_000, max_in_flight=4
    )  # would hold it a minute
    with running_worker(engine, redis_server.url):
        leaving.start()
        wait_until(lambda: store.get("t1", batch_id).request_counts.completed >= 5, 120, "5 lines answered")  # type: ignore[union-attr]
        # The batch's progress is on the batch board (`conveyor top`, the dashboard) while it runs.
        (view,) = [json.loads(v) for v in r.hvals(K.batches)]
        assert view["id"].endswith(batch_id) and view["total"] == n
        leaving.stop()
        assert (
            leaving.driving() == [] and r.get(K.batch(batch_id, "lease")) is None
        )  # released, not left to expire
        assert store.get("t1", batch_id).status == "in_progress"  # type: ignore[union-attr]
        taking = make_pool(redis_server.url, "replica-b", lease_ms=60_000, max_in_flight=4)
        taking.start()
        try:
            b = _wait_final(r, batch_id, 60)
        finally:
            taking.stop()
    assert b.status == "completed" and b.request_counts.completed == n
    assert r.hlen(K.batches) == 0  # off the board once done
    assert Counter(x["custom_id"] for x in _file_lines(r, b.output_file_id)) == Counter(
        {f"h{i}": 1 for i in range(n)}
    )

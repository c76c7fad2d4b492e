"""A worker whose lease lapsed must not acknowledge a job its successor now owns (docs/protocol.md).

Deterministic: two Worker objects driven one `tick()` at a time against a real redis-server; the only
waits are lower bounds (the lease must have lapsed), never races.
"""

from __future__ import annotations

import json

import pytest

from tests.helpers.worker_fakes import FakeEngine, wait_until
from worker.client import enqueue
from worker.config import WorkerConfig
from worker.connection import connect
from worker.keys import EVENT_FIELD, Keys
from worker.run.loop import Worker

pytestmark = pytest.mark.redis
K = Keys()
LEASE_MS = 300


def make_worker(url: str, consumer: str) -> Worker:
    cfg = WorkerConfig(group="test", consumer=consumer, lease_ms=LEASE_MS, block_ms=20)
    worker = Worker(FakeEngine(step_s=0), connect(url), cfg)
    worker.start()
    return worker


def tick_until(worker: Worker, done, what: str, limit: int = 200) -> None:
    for _ in range(limit):
        if done():
            return
        worker.tick()
    raise AssertionError(f"{worker.cfg.consumer}: no {what} after {limit} ticks")


def lease_lapsed(r, job_id: str) -> bool:
    pending = r.xpending_range(K.requests, "test", "-", "+", 10)
    idle = all(p["time_since_delivered"] > LEASE_MS for p in pending)
    return bool(pending) and idle and not r.exists(K.owner(job_id))


def events(r, job_id: str) -> list[dict]:
    return [json.loads(f[EVENT_FIELD]) for _, f in r.xrange(K.out(job_id))]


def close(worker: Worker) -> None:
    """Stop without the shutdown round: as if the process had died."""
    worker.lanes[0].cancels.stop()
    worker.nodes.close()
    worker.io.shutdown(wait=True)


def test_stale_worker_loses_the_terminal_write_and_leaves_the_entry_pending(redis_server, r):
    live = r.pubsub()
    live.subscribe(K.out("j"))
    a, b = make_worker(redis_server.url, "a"), make_worker(redis_server.url, "b")
    try:
        enqueue(r, {"id": "j", "prompt": "race", "max_tokens": 40})
        tick_until(a, lambda: len(events(r, "j")) >= 3, "token events")
        # A cancel only A heard ends the job in A's engine; A's next tick writes the token event of the
        # step before and queues the terminal `done` for the round after. Then A freezes.
        a.lanes[0].aborter.abort(a.lanes[0].inflight["j"], "cancel")
        tick_until(a, lambda: "j" not in a.lanes[0].inflight, "terminal event queued")
        written_by_a = len(events(r, "j"))
        assert events(r, "j")[-1]["type"] == "token" and a.lanes[0].publisher.owed, (
            "A's terminal is not sent yet"
        )

        wait_until(
            lambda: lease_lapsed(r, "j"), 10, "A's lease to lapse: its owner key and pending idle time"
        )
        tick_until(b, lambda: "j" in b.lanes[0].inflight, "takeover")
        tick_until(b, lambda: len(events(r, "j")) >= written_by_a + 2, "B's events")
        close(b)  # B crashes mid-job

        a.tick()  # A wakes up and sends its round with the terminal event: it must lose, wholly
        assert not any(e["type"] == "done" for e in events(r, "j")), "B wrote first: A's done is refused"
        published = []
        while (message := live.get_message(timeout=0.05)) is not None:
            if message["type"] == "message":
                published.append(json.loads(message["data"]))
        assert not any(e["type"] == "done" for e in published), "no stale done on the live channel"
        indices = [e["index"] for e in published if e["type"] == "token"]
        assert indices == sorted(set(indices)), "no stale token event on the live channel"
        pending = r.xpending_range(K.requests, "test", "-", "+", 10)
        assert [p["consumer"] for p in pending] == [b"b"], "the entry stays pending for B, not acked"
        assert "j" not in a.lanes[0].inflight

        # B restarted under its name finishes the job: the client is not left waiting.
        b = make_worker(redis_server.url, "b")
        tick_until(b, lambda: events(r, "j")[-1]["type"] == "done", "the terminal event")
        got = events(r, "j")
        tokens = [e for e in got if e["type"] == "token"]
        assert [e["index"] for e in tokens] == list(range(len(tokens))), "indices exactly once"
        assert got[-1]["usage"]["completion_tokens"] == 40
        tick_until(b, lambda: not r.xpending(K.requests, "test")["pending"], "the ack")
        assert not r.exists(K.owner("j"))
    finally:
        close(a)
        close(b)
        live.close()


def test_a_flushed_script_cache_is_reloaded_and_nothing_is_lost(redis_server, r):
    """A Redis restart or SCRIPT FLUSH forgets the script: the call answers NOSCRIPT, runs again."""
    worker = make_worker(redis_server.url, "a")
    try:
        enqueue(r, {"id": "f", "prompt": "flush", "max_tokens": 12})
        tick_until(worker, lambda: len(events(r, "f")) >= 3, "token events")
        r.script_flush()
        tick_until(worker, lambda: events(r, "f")[-1]["type"] == "done", "the terminal event")
        tokens = [e["index"] for e in events(r, "f") if e["type"] == "token"]
        assert tokens == list(range(12)) and "f" not in worker.lanes[0].inflight
        assert not r.xpending(K.requests, "test")["pending"]
    finally:
        close(worker)

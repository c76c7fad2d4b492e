"""Writing events: the output stream (replayable) and the pub/sub channel (live), in the step's round.

Exactly once per event: each event goes in with an explicit entry id 0-<seq>, seq counting the job's
events from 1. Redis refuses an id not above the stream's last one, so if another worker took the job
over and wrote first, our write fails and we drop the job instead of writing a second history. A claiming
worker reads the last seq back from the stream (resume.py) and continues after it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import redis

from worker.config import WorkerConfig
from worker.errors import JobError
from worker.events import error_event
from worker.keys import EVENT_FIELD
from worker.lease import add_release
from worker.round import Round
from worker.state import InFlight

_ID_TOO_SMALL = "equal or smaller"


def add_events(
    rnd: Round,
    cfg: WorkerConfig,
    job: InFlight,
    payloads: list[bytes],
    on_lost: Callable[[InFlight], None],
    terminal: bool = False,
) -> None:
    key = cfg.keys.out(job.job_id)

    def check(result) -> None:
        if not isinstance(result, redis.ResponseError):
            return
        # After a dropped connection the first try may have landed: the conflict is then our own write.
        if rnd.retried and _ID_TOO_SMALL in str(result):
            return
        on_lost(job)

    for payload in payloads:
        entry_id = f"0-{job.next_seq}"
        job.next_seq += 1
        # Ready argument tuples (Round.raw): this runs per token event.
        rnd.raw(("XADD", key, "MAXLEN", "~", cfg.stream_maxlen, entry_id, EVENT_FIELD, payload), check)
        rnd.raw(("PUBLISH", key, payload))
    # The TTL counts from the last write: set it on the first event, refresh it now and then while the
    # job runs (not every step: that would be one more command per job per step), and on the last one.
    now = time.monotonic()
    if terminal or job.ttl_set_at is None or now - job.ttl_set_at > cfg.stream_ttl_s / 4:
        job.ttl_set_at = now
        rnd.raw(("EXPIRE", key, cfg.stream_ttl_s))


def add_finish(rnd: Round, cfg: WorkerConfig, job: InFlight) -> None:
    """After the terminal event, in the same MULTI: acknowledge and forget the job's bookkeeping."""
    add_ack(rnd, cfg, job.entry_id)
    add_release(rnd, cfg, job.job_id)
    _forget(rnd, cfg, job.job_id)


def add_ack(rnd: Round, cfg: WorkerConfig, entry_id: bytes) -> None:
    rnd.add(lambda p: p.xack(cfg.keys.requests, cfg.group, entry_id))


def add_failure(
    rnd: Round, cfg: WorkerConfig, entry_id: bytes, error: JobError, raw: bytes | None, owned: bool
) -> None:
    """A job that will not run: error event (when it has an id), a dead-letter copy, then the ack."""
    if error.job_id is not None:
        key = cfg.keys.out(error.job_id)
        payload = error_event(error.code.value, error.message)
        # An auto id: above any 0-<seq> a previous attempt wrote, and terminal for resume.py.
        rnd.add(lambda p: p.xadd(key, {EVENT_FIELD: payload}, maxlen=cfg.stream_maxlen, approximate=True))
        rnd.add(lambda p: p.publish(key, payload))
        rnd.add(lambda p: p.expire(key, cfg.stream_ttl_s))
    dead = {
        b"entry_id": entry_id,
        b"code": error.code.value,
        b"reason": error.message[:2000],
        b"consumer": cfg.consumer,
        b"job": (raw or b"")[: cfg.limits.max_payload_bytes],
    }
    if error.job_id is not None:
        dead[b"id"] = error.job_id
    rnd.add(lambda p: p.xadd(cfg.keys.dead, dead, maxlen=cfg.dead_maxlen, approximate=True))
    add_ack(rnd, cfg, entry_id)
    if owned and error.job_id is not None:
        add_release(rnd, cfg, error.job_id)
        _forget(rnd, cfg, error.job_id)


def _forget(rnd: Round, cfg: WorkerConfig, job_id: str) -> None:
    rnd.add(lambda p: p.hdel(cfg.keys.attempts, job_id))
    cancel_key = cfg.keys.cancel(job_id)
    rnd.add(lambda p: p.delete(cancel_key))

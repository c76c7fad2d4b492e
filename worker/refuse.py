"""Ending a job that will not run: an error event (when it has an id), a dead-letter copy, then the ack."""

from __future__ import annotations

from worker.config import WorkerConfig
from worker.errors import JobError
from worker.events import error_event
from worker.keys import EVENT_FIELD
from worker.lease import add_release
from worker.round import Handler, Round


def add_ack(rnd: Round, cfg: WorkerConfig, entry_id: bytes, on_acked: Handler | None = None) -> None:
    rnd.add(lambda p: p.xack(cfg.keys.requests, cfg.group, entry_id), on_acked)


def add_failure(
    rnd: Round,
    cfg: WorkerConfig,
    entry_id: bytes,
    error: JobError,
    raw: bytes | None,
    owned: bool,
    on_acked: Handler | None = None,
) -> None:
    if error.job_id is not None:
        key = cfg.keys.out(error.job_id)
        payload = error_event(error.code.value, error.message)
        # An auto id: above any 0-<seq> a previous attempt wrote, and terminal for resume.py.
        rnd.add(lambda p: p.xadd(key, {EVENT_FIELD: payload}, maxlen=cfg.stream_maxlen, approximate=True))
        rnd.raw(("SPUBLISH" if cfg.cluster else "PUBLISH", key, payload))
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
    add_ack(rnd, cfg, entry_id, on_acked)
    if owned and error.job_id is not None:
        add_release(rnd, cfg, error.job_id)
        _forget(rnd, cfg, error.job_id)


def _forget(rnd: Round, cfg: WorkerConfig, job_id: str) -> None:
    rnd.add(lambda p: p.hdel(cfg.keys.attempts, job_id))
    cancel_key = cfg.keys.cancel(job_id)
    rnd.add(lambda p: p.delete(cancel_key))

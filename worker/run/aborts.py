"""Stopping jobs early: cancel requests (pub/sub or a cancel key), deadlines, and jobs another worker took.

A cancel for a job read but not admitted yet is remembered for a while and applied on admission.
"""

from __future__ import annotations

import time

import structlog

from worker.config import WorkerConfig
from worker.run.cancel_listener import CancelListener
from worker.wire.job_record import InFlight
from worker.wire.round import Round

log = structlog.get_logger("conveyor.worker")

_REMEMBER_CANCEL_S = 30.0


class Aborter:
    def __init__(self, engine, inflight: dict[str, InFlight], cancels: CancelListener, cfg: WorkerConfig):
        self.engine, self.inflight, self.cancels, self.cfg = engine, inflight, cancels, cfg
        self._unmatched: dict[str, float] = {}  # job id -> time.monotonic() the cancel was heard

    def apply_signals(self) -> None:
        """Cancels heard on the channel, and deadlines passed: abort in the engine (in memory)."""
        now = time.monotonic()
        for job_id in self.cancels.take():
            if job_id in self.inflight:
                self.abort(self.inflight[job_id], "cancel")
            else:  # maybe read but not admitted yet: remember it a little while
                self._unmatched[job_id] = now
        self._unmatched = {k: t for k, t in self._unmatched.items() if now - t < _REMEMBER_CANCEL_S}
        now_ms = time.time() * 1000
        for job in self.inflight.values():
            if job.job.deadline_ms is not None and job.job.deadline_ms <= now_ms:
                self.abort(job, "deadline")

    def add_key_check(self, rnd: Round) -> None:
        """MGET of the in-flight jobs' cancel keys."""
        if not self.inflight:
            return
        ids = list(self.inflight)
        keys = [self.cfg.keys.cancel(i) for i in ids]

        def handle(reply) -> None:
            if isinstance(reply, Exception):
                return
            for job_id, value in zip(ids, reply, strict=False):
                if value is not None and job_id in self.inflight:
                    self.abort(self.inflight[job_id], "cancel")

        rnd.add(lambda p: p.mget(keys), handle)

    def on_admitted(self, job: InFlight) -> None:
        if self._unmatched.pop(job.job_id, None) is not None and self.engine.abort(job.job_id):
            job.stop_reason = "cancel"

    def abort(self, job: InFlight, reason: str) -> None:
        if job.stop_reason is None and not job.dropped and self.engine.abort(job.job_id):
            job.stop_reason = reason
            log.info("job aborted", request_id=job.job_id, reason=reason)

    def lost(self, job: InFlight) -> None:
        """Another worker wrote to this job's stream first: it owns the job now. Stop without a trace."""
        if not job.dropped:
            log.warning("job taken over by another worker, dropping it", request_id=job.job_id)
            job.dropped = True
            if not self.engine.abort(job.job_id):
                self.inflight.pop(job.job_id, None)

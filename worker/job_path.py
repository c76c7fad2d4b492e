"""A job's path through the worker, from the entry read off its lane to the XACK that ends it.

    READ ──lookups──▶ ADMITTED ─┐                                 (in the engine; its attempt is owed)
      │               RESUMED ──┴─attempt counted─▶ RUNNING ──last sample ended─▶ FINISHED
      │                                               │                             │ events script
      ├────────────▶ REFUSED ─────────────────────────┼── XACK landed ─────────────▶ ACKNOWLEDGED
      ├────────────▶ DUPLICATE ───────────────────────┘
      └────────────▶ LEFT       (a live owner elsewhere runs it: stays pending; also a job taken over)

Where each transition happens (this file, unless named):
- READ: XREADGROUP (intake/stream_reader.py), own pending entries at start, or XAUTOCLAIM
  (recover/takeover_claim.py) put an `Arrived` in `Worker.arrived`.
- READ -> ... : `look_up` adds the job's lookups to the round being built (owner SET NX GET, HGET
  attempts, XRANGE of its output stream, EXISTS cancel); `_decide` takes the four replies of that round
  together and moves the job on. A malformed entry is REFUSED by `look_up` itself.
- ADMITTED | RESUMED -> RUNNING: the HINCRBY attempts owed by `_decide` goes in the next round, which
  the loop has answered before the step that runs the job (`Round.before_step`: that step waits one
  round trip), so a crash while running it counts (like arq); its reply moves the job on (`_counted`).
- RUNNING -> FINISHED: `finish`, called by the loop (run/loop.py) for each job whose last sample ended
  in the step (publish/publisher.py, plan_events), its terminal event queued.
- FINISHED -> ACKNOWLEDGED: `acknowledged`, called by the Publisher (publish/publisher.py) when the
  events script wrote the terminal event and, in the same call, its XACK.
- REFUSED | DUPLICATE -> ACKNOWLEDGED: the reply to the XACK owed by `_decide` (`_acked`).

What a decision owes to Redis is kept in `owed` and added by the loop to the next round it builds: no
reply handler writes into another round.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import redis
import structlog

from engine.client import EngineClient
from worker.config import WorkerConfig
from worker.error_codes import ErrorCode, JobError
from worker.intake.parse_job import parse_entry
from worker.keys import EVENT_FIELD, JOB_FIELD, alone_field
from worker.protocol import Job
from worker.publish.event_payloads import error_event
from worker.recover.resume_point import read_resume
from worker.run.engine_request import start_in_engine
from worker.run.job_lease import add_release
from worker.wire.job_record import Arrived, InFlight, Stage
from worker.wire.round import Handler, Round

if TYPE_CHECKING:
    from worker.run.isolation import Isolation

log = structlog.get_logger("conveyor.job")


# Called with the job's id (None while a malformed entry has none) or entry id, and its new stage.
StageListener = Callable[[str | bytes, Stage], None]


class JobPath:
    def __init__(
        self,
        cfg: WorkerConfig,
        engine: EngineClient,
        running: Callable[[str], InFlight | None],
        on_admitted: Callable[[InFlight], None],
        on_outcome: Callable[[str], None],
        on_full: Callable[[Arrived, Exception], None],
        isolation: Isolation,
    ) -> None:
        self.cfg, self.engine, self.isolation = cfg, engine, isolation
        self.running = running
        self.on_admitted, self.on_outcome, self.on_full = on_admitted, on_outcome, on_full
        self.owed: list[Callable[[Round], None]] = []  # writes decided on replies, for the next round
        self.on_stage: StageListener = _log_stage

    def add_owed(self, rnd: Round) -> None:
        owed, self.owed = self.owed, []
        for add in owed:
            add(rnd)

    # ---- READ -> ... ------------------------------------------------------------------------------------
    def look_up(self, rnd: Round, arrived: Arrived) -> None:
        cfg = self.cfg
        if arrived.fields is None:  # trimmed away while pending: nothing to run or to answer
            add_ack(rnd, cfg, arrived.entry_id)
            return
        raw = arrived.fields.get(JOB_FIELD)
        try:
            job = parse_entry(arrived.fields, cfg.limits)
        except JobError as error:
            self._refuse(rnd, arrived, error, raw, owned=False)
            return
        except Exception as exc:  # a parser corner case must not take the worker down
            log.exception("unexpected error parsing a job")
            self._refuse(
                rnd, arrived, JobError(ErrorCode.INTERNAL, f"{type(exc).__name__}"), raw, owned=False
            )
            return
        owner, out, cancel = cfg.keys.owner(job.id), cfg.keys.out(job.id), cfg.keys.cancel(job.id)
        rnd.add_group(
            [
                # the owner key (run/job_lease.py): None when we now own the job, else the owner's name
                lambda p: p.set(owner, cfg.consumer, nx=True, px=cfg.lease_ms, get=True),
                lambda p: p.hmget(cfg.keys.attempts, [job.id, alone_field(job.id)]),
                lambda p: p.xrange(out, count=cfg.stream_maxlen),
                lambda p: p.exists(cancel),
            ],
            lambda replies: self._decide(arrived, job, raw, replies),
        )

    def _decide(self, arrived: Arrived, job: Job, raw: bytes | None, replies: list) -> None:
        try:
            self._decide_or_raise(arrived, job, raw, replies)
        except Exception as exc:  # whatever a client sent, the worker goes on serving
            log.exception("unexpected error admitting a job", request_id=job.id)
            error = JobError(ErrorCode.INTERNAL, f"{type(exc).__name__}: {exc}"[:500], job.id)
            self.owed.append(lambda rnd: self._refuse(rnd, arrived, error, raw, owned=True))

    def _decide_or_raise(self, arrived: Arrived, job: Job, raw: bytes | None, replies: list) -> None:
        cfg = self.cfg
        full = next((r for r in replies if isinstance(r, redis.OutOfMemoryError)), None)
        if full is not None:  # Redis is full: decide nothing, try again once it has room (stays READ)
            self.on_full(arrived, full)
            return
        owner, started, entries, cancelled = replies
        local = self.running(job.id)
        if local is not None or (owner is not None and owner != cfg.consumer.encode()):
            # Running here or elsewhere. A new entry is a duplicate enqueue; a reclaimed one waits for
            # that owner's lease to lapse (or for its terminal event). Neither touches the attempt count.
            if local is None or local.entry_id != arrived.entry_id:
                if arrived.reclaimed:
                    self.on_stage(job.id, Stage.LEFT)
                else:
                    self._duplicate(arrived, job, forget=False)
            return
        if any(isinstance(r, Exception) for r in replies):
            bad = next(r for r in replies if isinstance(r, Exception))
            failed = JobError(ErrorCode.INTERNAL, f"redis: {bad}", job.id)
            self.owed.append(lambda rnd: self._refuse(rnd, arrived, failed, raw, owned=True))
            return
        resume = read_resume(entries)
        if resume.terminal:  # finished before (a re-enqueued id, or a crash between event and ack)
            self._duplicate(arrived, job, forget=True)
            return
        now_ms = time.time() * 1000
        # Duplicates never reach this point. A job an earlier attempt of which did not finish runs alone;
        # it is refused only once it has used its attempts and one of them ran alone (run/isolation.py).
        count, ran_alone = started
        attempts = int(count or 0) + 1
        suspect = attempts > 1
        error: JobError | None = None
        if suspect and ran_alone and attempts > cfg.max_attempts:
            error = JobError(ErrorCode.TOO_MANY_ATTEMPTS, f"{attempts - 1} attempts did not finish", job.id)
        elif job.deadline_ms is not None and job.deadline_ms <= now_ms:
            error = JobError(ErrorCode.DEADLINE_EXCEEDED, "deadline_ms passed before the job started", job.id)
        if error is not None:
            late = error
            self.owed.append(lambda rnd: self._refuse(rnd, arrived, late, raw, owned=True))
            return
        if self.isolation.must_wait(suspect):  # stays READ: held, looked up again once the worker is empty
            self.owed.append(lambda rnd: add_release(rnd, cfg, job.id))
            self.isolation.hold(arrived)
            return
        state = InFlight(
            job=job,
            entry_id=arrived.entry_id,
            enqueued_ms=float(arrived.entry_id.split(b"-")[0]),
            admitted_ms=now_ms,
            n=job.n or 1,
            next_seq=resume.next_seq,
        )
        # The attempt is counted whether or not the engine takes the job (as before: a refusal by the
        # engine is one attempt), in the next round, before the step that runs it.
        self.owed.append(lambda rnd: self._count_attempt(rnd, state, suspect))
        try:
            start_in_engine(self.engine, job, resume.prior_lists(job.n or 1), cfg.limits.max_tokens)
        except JobError as exc:
            refused = exc
            self.owed.append(lambda rnd: self._refuse(rnd, arrived, refused, raw, owned=True))
            return
        state.stage = Stage.RESUMED if resume.prior else Stage.ADMITTED
        self.on_stage(job.id, state.stage)
        self.on_admitted(state)
        if suspect:
            self.isolation.alone = job.id
            log.info("job runs alone: an earlier attempt did not finish", request_id=job.id, attempt=attempts)
        if resume.prior:
            log.info(
                "job resumed",
                request_id=job.id,
                attempt=attempts,
                prior_tokens=sum(map(len, resume.prior.values())),
            )
        if cancelled and self.engine.abort(job.id):
            state.stop_reason = "cancel"

    # ---- ADMITTED | RESUMED -> RUNNING --------------------------------------------------------------
    def _count_attempt(self, rnd: Round, job: InFlight, alone: bool) -> None:
        attempts = self.cfg.keys.attempts
        rnd.before_step = True
        rnd.add(lambda p: p.hincrby(attempts, job.job_id, 1), lambda _: self._counted(job))
        if alone:
            rnd.add(lambda p: p.hset(attempts, alone_field(job.job_id), 1))

    def _counted(self, job: InFlight) -> None:
        if job.stage in (Stage.ADMITTED, Stage.RESUMED):
            job.stage = Stage.RUNNING
            self.on_stage(job.job_id, Stage.RUNNING)

    # ---- RUNNING -> FINISHED -> ACKNOWLEDGED ------------------------------------------------------------
    def finish(self, job: InFlight) -> None:
        """Its terminal event is queued; the events script acknowledges the entry once it is written."""
        job.stage = Stage.FINISHED
        self.on_stage(job.job_id, Stage.FINISHED)

    def acknowledged(self, job: InFlight) -> None:
        job.stage = Stage.ACKNOWLEDGED
        self.on_stage(job.job_id, Stage.ACKNOWLEDGED)

    def left(self, job: InFlight) -> None:
        """Another worker wrote to its stream first: it runs the job now."""
        job.stage = Stage.LEFT
        self.on_stage(job.job_id, Stage.LEFT)

    # ---- REFUSED | DUPLICATE -> ACKNOWLEDGED ----------------------------------------------------------
    def _duplicate(self, arrived: Arrived, job: Job, forget: bool) -> None:
        """A second entry of a job that runs or ran: acknowledged unanswered; `forget` its bookkeeping
        when it finished before."""
        cfg = self.cfg
        self.on_stage(job.id, Stage.DUPLICATE)
        self.on_outcome("duplicate")

        def add(rnd: Round) -> None:
            add_ack(rnd, cfg, arrived.entry_id, lambda r: self._acked(job.id, r))
            if forget:
                add_release(rnd, cfg, job.id)
                rnd.add(lambda p: p.hdel(cfg.keys.attempts, job.id, alone_field(job.id)))

        self.owed.append(add)

    def _refuse(self, rnd: Round, arrived: Arrived, error: JobError, raw: bytes | None, owned: bool) -> None:
        log.warning("job refused", request_id=error.job_id, code=error.code.value, reason=error.message)
        name = error.job_id or arrived.entry_id
        self.on_stage(name, Stage.REFUSED)
        self._add_failure(rnd, arrived.entry_id, error, raw, owned, lambda r: self._acked(name, r))
        self.on_outcome(error.code.value)

    def _add_failure(
        self, rnd: Round, entry_id: bytes, error: JobError, raw: bytes | None, owned: bool, on_acked: Handler
    ) -> None:
        """An error event (when the job has an id), a dead-letter copy, then the XACK."""
        cfg = self.cfg
        if error.job_id is not None:
            key = cfg.keys.out(error.job_id)
            payload = error_event(error.code.value, error.message)
            # An auto id: above any 0-<seq> a previous attempt wrote, and terminal for resume_point.py.
            rnd.add(lambda p: p.xadd(key, {EVENT_FIELD: payload}, maxlen=cfg.stream_maxlen, approximate=True))
            rnd.raw(("SPUBLISH" if cfg.cluster else "PUBLISH", key, payload))
            rnd.add(lambda p: p.expire(key, cfg.stream_ttl_s))
        dead = {
            b"entry_id": entry_id,
            b"code": error.code.value,
            b"reason": error.message[:2000],
            b"consumer": cfg.consumer,
            b"group": cfg.group,  # the model's group: `conveyor top` counts dead letters per model
            b"job": (raw or b"")[: cfg.limits.max_payload_bytes],
        }
        if error.job_id is not None:
            dead[b"id"] = error.job_id
        rnd.add(lambda p: p.xadd(cfg.keys.dead, dead, maxlen=cfg.dead_maxlen, approximate=True))
        add_ack(rnd, cfg, entry_id, on_acked)
        if owned and error.job_id is not None:
            job_id, cancel_key = error.job_id, cfg.keys.cancel(error.job_id)
            add_release(rnd, cfg, job_id)
            rnd.add(lambda p: p.hdel(cfg.keys.attempts, job_id, alone_field(job_id)))
            rnd.add(lambda p: p.delete(cancel_key))

    def _acked(self, name: str | bytes, reply) -> None:
        if not isinstance(reply, Exception):
            self.on_stage(name, Stage.ACKNOWLEDGED)


def add_ack(rnd: Round, cfg: WorkerConfig, entry_id: bytes, on_acked: Handler | None = None) -> None:
    rnd.add(lambda p: p.xack(cfg.keys.requests, cfg.group, entry_id), on_acked)


def _log_stage(name: str | bytes, stage: Stage) -> None:
    log.debug("job stage", request_id=name, stage=stage.value)

"""A job's path through the worker, from the entry read off its lane to the XACK that ends it.

    READ ──lookups──▶ ADMITTED ─┐                                 (in the engine; its attempt is owed)
      │               RESUMED ──┴─attempt counted─▶ RUNNING ──last sample ended─▶ FINISHED
      │                                               │                             │ events script
      ├────────────▶ REFUSED ─────────────────────────┼── XACK landed ─────────────▶ ACKNOWLEDGED
      ├────────────▶ DUPLICATE ───────────────────────┘
      └────────────▶ LEFT       (a live owner elsewhere runs it: stays pending; also a job taken over)

The three files of the path: intake/stream_reader.py reads the entry; this file looks it up, decides and
writes what the decision owes; publish/publisher.py writes its events and, with the last, its XACK.
- READ: XREADGROUP (intake/stream_reader.py), own pending entries at start, or XAUTOCLAIM
  (recover/takeover_claim.py) put an `Arrived` in `Worker.arrived`.
- READ -> ... : `look_up` adds the job's lookups to the round being built (owner SET NX GET, HMGET
  attempts, XRANGE of its output stream, EXISTS cancel). Once that round is answered the loop calls
  `settle`, which takes each job's four replies to `decide` (a pure function: replies in, a decision
  out) and acts on the decision in memory (starts an admitted job in the engine). What it owes Redis
  is kept as data in `owed` and written by `add_owed` into the next round the loop builds. A malformed
  entry is REFUSED by `look_up` itself.
- ADMITTED | RESUMED -> RUNNING: the HINCRBY attempts an admission owes goes in the next round, which
  the loop has answered before the step that runs the job (`Round.before_step`: that step waits one
  round trip), so a crash while running it counts (like arq); its reply moves the job on (`_counted`).
- RUNNING -> FINISHED: `finish`, called by the loop (run/loop.py) for each job whose last sample ended
  in the step (publish/publisher.py, plan_events), its terminal event queued.
- FINISHED -> ACKNOWLEDGED: `acknowledged`, called by the Publisher (publish/publisher.py) when the
  events script wrote the terminal event and, in the same call, its XACK.
- REFUSED | DUPLICATE -> ACKNOWLEDGED: the reply to the XACK their decision owes (`_acked`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, NamedTuple

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
    from worker.run.observer import Observer

log = structlog.get_logger("conveyor.job")


# ---- the decision: a pure function of a job's lookups ---------------------------------------------------
@dataclass(frozen=True)
class Admit:
    job: InFlight  # its record, stage READ until it is in the engine
    suspect: bool  # an earlier attempt did not finish: it runs alone (run/isolation.py)
    prior: list[list[int]] | None  # per sample, the tokens an earlier attempt published
    cancelled: bool  # its cancel key exists: aborted as soon as it is in the engine


@dataclass(frozen=True)
class Refuse:
    error: JobError  # an error event (when it has an id), a dead letter, the XACK
    owned: bool = True  # we took its owner key: released, its attempt count and cancel key deleted


@dataclass(frozen=True)
class Duplicate:
    job_id: str
    forget: bool  # it finished before: its owner key and attempt count go too


@dataclass(frozen=True)
class Left:
    """A reclaimed entry whose job a live owner runs: not ours yet, stays pending."""


@dataclass(frozen=True)
class Hold:
    """Not now (a suspect waits for an empty worker; anything waits while a suspect runs alone): the owner
    key released, looked up again once the worker is empty."""

    job_id: str


@dataclass(frozen=True)
class Full:
    """Redis refused a lookup for lack of memory: nothing decided, looked up again once it has room."""

    error: Exception


@dataclass(frozen=True)
class Running:
    """This very entry already runs here (read again): nothing to do."""


Decision = Admit | Refuse | Duplicate | Left | Hold | Full | Running


class Here(NamedTuple):
    """What this worker runs, as a decision needs it."""

    local: InFlight | None  # the job with this id running here, if any
    busy: bool  # any job runs here
    alone: bool  # a suspect runs here alone


def decide(
    job: Job, arrived: Arrived, replies: list, cfg: WorkerConfig, now_ms: float, here: Here
) -> Decision:
    """The job's fate from its lookups' replies (owner SET NX GET, HMGET attempts, XRANGE output, EXISTS
    cancel) and what runs here. Reads nothing else, writes nothing."""
    full = next((r for r in replies if isinstance(r, redis.OutOfMemoryError)), None)
    if full is not None:
        return Full(full)
    owner, started, entries, cancelled = replies
    if here.local is not None or (owner is not None and owner != cfg.consumer.encode()):
        # Running here or elsewhere. A new entry is a duplicate enqueue; a reclaimed one waits for that
        # owner's lease to lapse (or for its terminal event). Neither touches the attempt count.
        if here.local is not None and here.local.entry_id == arrived.entry_id:
            return Running()
        return Left() if arrived.reclaimed else Duplicate(job.id, forget=False)
    bad = next((r for r in replies if isinstance(r, Exception)), None)
    if bad is not None:
        return Refuse(JobError(ErrorCode.INTERNAL, f"redis: {bad}", job.id))
    resume = read_resume(entries)
    if resume.terminal:  # finished before (a re-enqueued id, or a crash between event and ack)
        return Duplicate(job.id, forget=True)
    # A job an earlier attempt of which did not finish runs alone; it is refused only once it has used its
    # attempts and one of them ran alone (run/isolation.py).
    count, ran_alone = started
    attempts = int(count or 0) + 1
    suspect = attempts > 1
    if suspect and ran_alone and attempts > cfg.max_attempts:
        return Refuse(
            JobError(ErrorCode.TOO_MANY_ATTEMPTS, f"{attempts - 1} attempts did not finish", job.id)
        )
    if job.deadline_ms is not None and job.deadline_ms <= now_ms:
        return Refuse(
            JobError(ErrorCode.DEADLINE_EXCEEDED, "deadline_ms passed before the job started", job.id)
        )
    if here.alone or (suspect and here.busy):
        return Hold(job.id)
    record = InFlight(
        job=job,
        entry_id=arrived.entry_id,
        enqueued_ms=float(arrived.entry_id.split(b"-")[0]),
        admitted_ms=now_ms,
        n=job.n or 1,
        next_seq=resume.next_seq,
    )
    return Admit(record, suspect, resume.prior_lists(job.n or 1), bool(cancelled))


class Looked(NamedTuple):
    """A job whose lookups were answered, waiting for `settle`."""

    arrived: Arrived
    job: Job
    raw: bytes | None
    replies: list


class Owed(NamedTuple):
    """What a decision owes Redis, written into the next round (`add_owed`)."""

    decision: Admit | Refuse | Duplicate | Hold
    arrived: Arrived
    raw: bytes | None


class Settled(NamedTuple):
    admitted: list[InFlight]  # now in the engine and in the worker's in-flight jobs
    full: list[tuple[Arrived, Exception]]  # Redis was full: still READ, to look up again


# Called with the job's id (None while a malformed entry has none) or entry id, and its new stage.
StageListener = Callable[[str | bytes, Stage], None]


class JobPath:
    def __init__(self, cfg: WorkerConfig, engine: EngineClient, observer: Observer) -> None:
        self.cfg, self.engine, self.observer = cfg, engine, observer
        self.looked: list[Looked] = []  # lookups answered in the round just dispatched
        self.owed: list[Owed] = []  # decided on replies, for the next round
        self.on_stage: StageListener = _log_stage

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
            self._write(rnd, Owed(Refuse(error, owned=False), arrived, raw))
            return
        except Exception as exc:  # a parser corner case must not take the worker down
            log.exception("unexpected error parsing a job")
            internal = JobError(ErrorCode.INTERNAL, f"{type(exc).__name__}")
            self._write(rnd, Owed(Refuse(internal, owned=False), arrived, raw))
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
            lambda replies: self.looked.append(Looked(arrived, job, raw, replies)),
        )

    def settle(self, inflight: dict[str, InFlight], isolation: Isolation, now_ms: float) -> Settled:
        """Decide each job looked up in the round just answered, in order (a job admitted is running for
        the next one's decision), and act on it: an admitted job starts in the engine and joins `inflight`;
        what each decision owes Redis joins `owed`."""
        looked, self.looked = self.looked, []
        settled = Settled([], [])
        for arrived, job, raw, replies in looked:
            local = inflight.get(job.id)
            here = Here(local, bool(inflight), isolation.running_alone())
            try:
                decision = decide(job, arrived, replies, self.cfg, now_ms, here)
                if isinstance(decision, Admit):
                    self._admit(decision, arrived, raw, inflight, isolation, settled)
                    continue
            except Exception as exc:  # whatever a client sent, the worker goes on serving
                log.exception("unexpected error admitting a job", request_id=job.id)
                decision = Refuse(JobError(ErrorCode.INTERNAL, f"{type(exc).__name__}: {exc}"[:500], job.id))
            if isinstance(decision, Full):
                settled.full.append((arrived, decision.error))
            elif isinstance(decision, Left):
                self.on_stage(job.id, Stage.LEFT)
            elif isinstance(decision, Hold):
                isolation.hold(arrived)
                self.owed.append(Owed(decision, arrived, raw))
            elif isinstance(decision, Duplicate):
                self.on_stage(job.id, Stage.DUPLICATE)
                self.observer.outcome("duplicate")
                self.owed.append(Owed(decision, arrived, raw))
            elif isinstance(decision, Refuse):
                self.owed.append(Owed(decision, arrived, raw))
        return settled

    def _admit(
        self,
        admit: Admit,
        arrived: Arrived,
        raw: bytes | None,
        inflight: dict[str, InFlight],
        isolation: Isolation,
        settled: Settled,
    ) -> None:
        job = admit.job
        # The attempt is counted whether or not the engine takes the job (a refusal by the engine is one
        # attempt), in the next round, before the step that runs it.
        self.owed.append(Owed(admit, arrived, raw))
        try:
            start_in_engine(self.engine, job.job, admit.prior, self.cfg.limits.max_tokens)
        except JobError as refused:
            self.owed.append(Owed(Refuse(refused), arrived, raw))
            return
        job.stage = Stage.RESUMED if admit.prior else Stage.ADMITTED
        self.on_stage(job.job_id, job.stage)
        inflight[job.job_id] = job
        settled.admitted.append(job)
        if admit.suspect:
            isolation.alone = job.job_id
            log.info("job runs alone: an earlier attempt did not finish", request_id=job.job_id)
        if admit.prior:
            log.info("job resumed", request_id=job.job_id, prior_tokens=sum(map(len, admit.prior)))
        if admit.cancelled and self.engine.abort(job.job_id):
            job.stop_reason = "cancel"

    # ---- what decisions owe: written into the next round ----------------------------------------------
    def add_owed(self, rnd: Round) -> None:
        owed, self.owed = self.owed, []
        for one in owed:
            self._write(rnd, one)

    def _write(self, rnd: Round, owed: Owed) -> None:
        cfg, decision = self.cfg, owed.decision
        if isinstance(decision, Admit):  # ADMITTED | RESUMED -> RUNNING once counted
            job = decision.job
            rnd.before_step = True
            rnd.add(lambda p: p.hincrby(cfg.keys.attempts, job.job_id, 1), lambda _: self._counted(job))
            if decision.suspect:
                rnd.add(lambda p: p.hset(cfg.keys.attempts, alone_field(job.job_id), 1))
        elif isinstance(decision, Hold):
            add_release(rnd, cfg, decision.job_id)
        elif isinstance(decision, Duplicate):  # acknowledged unanswered
            add_ack(rnd, cfg, owed.arrived.entry_id, partial(self._acked, decision.job_id))
            if decision.forget:
                self._forget(rnd, decision.job_id)
        else:
            self._refuse(rnd, owed.arrived, decision, owed.raw)

    def _counted(self, job: InFlight) -> None:
        if job.stage in (Stage.ADMITTED, Stage.RESUMED):
            job.stage = Stage.RUNNING
            self.on_stage(job.job_id, Stage.RUNNING)

    def _refuse(self, rnd: Round, arrived: Arrived, refuse: Refuse, raw: bytes | None) -> None:
        """An error event (when the job has an id), a dead-letter copy, then the XACK."""
        cfg, error = self.cfg, refuse.error
        log.warning("job refused", request_id=error.job_id, code=error.code.value, reason=error.message)
        name = error.job_id or arrived.entry_id
        self.on_stage(name, Stage.REFUSED)
        self.observer.outcome(error.code.value)
        if error.job_id is not None:
            key = cfg.keys.out(error.job_id)
            payload = error_event(error.code.value, error.message)
            # An auto id: above any 0-<seq> a previous attempt wrote, and terminal for resume_point.py.
            rnd.add(lambda p: p.xadd(key, {EVENT_FIELD: payload}, maxlen=cfg.stream_maxlen, approximate=True))
            rnd.raw(("SPUBLISH" if cfg.cluster else "PUBLISH", key, payload))
            rnd.add(lambda p: p.expire(key, cfg.stream_ttl_s))
        dead = {
            b"entry_id": arrived.entry_id,
            b"code": error.code.value,
            b"reason": error.message[:2000],
            b"consumer": cfg.consumer,
            b"group": cfg.group,  # the model's group: `conveyor top` counts dead letters per model
            b"job": (raw or b"")[: cfg.limits.max_payload_bytes],
        }
        if error.job_id is not None:
            dead[b"id"] = error.job_id
        rnd.add(lambda p: p.xadd(cfg.keys.dead, dead, maxlen=cfg.dead_maxlen, approximate=True))
        add_ack(rnd, cfg, arrived.entry_id, partial(self._acked, name))
        if refuse.owned and error.job_id is not None:
            self._forget(rnd, error.job_id)
            cancel_key = cfg.keys.cancel(error.job_id)
            rnd.add(lambda p: p.delete(cancel_key))

    def _forget(self, rnd: Round, job_id: str) -> None:
        """Its owner key and attempt count: the job is over."""
        add_release(rnd, self.cfg, job_id)
        rnd.add(lambda p: p.hdel(self.cfg.keys.attempts, job_id, alone_field(job_id)))

    def _acked(self, name: str | bytes, reply) -> None:
        if not isinstance(reply, Exception):
            self.on_stage(name, Stage.ACKNOWLEDGED)

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


def add_ack(rnd: Round, cfg: WorkerConfig, entry_id: bytes, on_acked: Handler | None = None) -> None:
    rnd.add(lambda p: p.xack(cfg.keys.requests, cfg.group, entry_id), on_acked)


def _log_stage(name: str | bytes, stage: Stage) -> None:
    log.debug("job stage", request_id=name, stage=stage.value)

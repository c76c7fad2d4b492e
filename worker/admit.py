"""Admission: from a stream entry to a request in the engine, or to an error event, in two round trips'
worth of commands folded into the loop's rounds.

Round k (this module's `add`): parse the payload; then for a well-formed job, in the same round
    SET owner NX GET (lease.py), HMGET attempts, XRANGE out:<id> (resume.py), EXISTS cancel:<id>.
Dispatch of round k (`_decide`): run it, resume it, or refuse it; what to write goes into round k+1 (the
round being built, handed to `_decide` by `Round.dispatch`), including HINCRBY attempts for a job that
runs (round k+1 is sent before the step that runs it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import redis
import structlog
from pydantic import ValidationError

from engine.client import EngineClient
from engine.errors import RequestRejected
from engine.prompt import Chat, Prompt
from engine.sampling_params import SamplingParams
from worker.config import WorkerConfig
from worker.errors import ErrorCode, JobError
from worker.intake import parse_entry
from worker.keys import JOB_FIELD, alone_field
from worker.lease import add_acquire, add_release
from worker.protocol import Job
from worker.refuse import add_ack, add_failure
from worker.rejections import job_error
from worker.resume import read_resume
from worker.round import Round
from worker.state import InFlight

if TYPE_CHECKING:
    from worker.isolation import Isolation

log = structlog.get_logger("conveyor.admit")


@dataclass(frozen=True)
class Arrived:
    entry_id: bytes
    fields: dict[bytes, bytes] | None  # None: the entry was trimmed away while pending
    # From our own pending list or XAUTOCLAIM: a live owner elsewhere means "not yet", not "duplicate".
    reclaimed: bool = False


class Admitter:
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

    def add(self, rnd: Round, arrived: Arrived) -> None:
        cfg = self.cfg
        if arrived.fields is None:
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
        replies: list = []
        out, cancel = cfg.keys.out(job.id), cfg.keys.cancel(job.id)
        keep = lambda reply, _into: replies.append(reply)  # noqa: E731
        add_acquire(rnd, cfg, job.id, keep)
        rnd.add(lambda p: p.hmget(cfg.keys.attempts, [job.id, alone_field(job.id)]), keep)
        rnd.add(lambda p: p.xrange(out, count=cfg.stream_maxlen), keep)
        rnd.add(
            lambda p: p.exists(cancel), lambda r, into: self._decide(arrived, job, raw, [*replies, r], into)
        )

    def _decide(self, arrived: Arrived, job: Job, raw: bytes | None, replies: list, into: Round) -> None:
        try:
            self._decide_or_raise(arrived, job, raw, replies, into)
        except Exception as exc:  # whatever a client sent, the worker goes on serving
            log.exception("unexpected error admitting a job", request_id=job.id)
            error = JobError(ErrorCode.INTERNAL, f"{type(exc).__name__}: {exc}"[:500], job.id)
            self._refuse(into, arrived, error, raw, owned=True)

    def _decide_or_raise(
        self, arrived: Arrived, job: Job, raw: bytes | None, replies: list, nxt: Round
    ) -> None:
        cfg = self.cfg
        full = next((r for r in replies if isinstance(r, redis.OutOfMemoryError)), None)
        if full is not None:  # Redis is full: decide nothing, try again once it has room
            self.on_full(arrived, full)
            return
        owner, started, entries, cancelled = replies
        local = self.running(job.id)
        if local is not None or (owner is not None and owner != cfg.consumer.encode()):
            # Running here or elsewhere. A new entry is a duplicate enqueue; a reclaimed one waits for
            # that owner's lease to lapse (or for its terminal event). Neither touches the attempt count.
            if local is None or local.entry_id != arrived.entry_id:
                if not arrived.reclaimed:
                    add_ack(nxt, cfg, arrived.entry_id)
                    self.on_outcome("duplicate")
            return
        if any(isinstance(r, Exception) for r in replies):
            bad = next(r for r in replies if isinstance(r, Exception))
            self._refuse(nxt, arrived, JobError(ErrorCode.INTERNAL, f"redis: {bad}", job.id), raw, owned=True)
            return
        resume = read_resume(entries)
        if resume.terminal:  # finished before (a re-enqueued id, or a crash between event and ack)
            add_ack(nxt, cfg, arrived.entry_id)
            add_release(nxt, cfg, job.id)
            nxt.add(lambda p: p.hdel(cfg.keys.attempts, job.id, alone_field(job.id)))
            self.on_outcome("duplicate")
            return
        now_ms = time.time() * 1000
        # This is an attempt: counted in the next round, which is sent before the step that runs the job,
        # so a crash while running it counts (like arq). Duplicates never reach this point. A job an
        # earlier attempt of which did not finish runs alone; it is refused only once it has used its
        # attempts and one of them ran alone (worker/isolation.py).
        count, ran_alone = started
        attempts = int(count or 0) + 1
        suspect = attempts > 1
        if suspect and ran_alone and attempts > cfg.max_attempts:
            error = JobError(ErrorCode.TOO_MANY_ATTEMPTS, f"{attempts - 1} attempts did not finish", job.id)
            self._refuse(nxt, arrived, error, raw, owned=True)
            return
        if job.deadline_ms is not None and job.deadline_ms <= now_ms:
            error = JobError(ErrorCode.DEADLINE_EXCEEDED, "deadline_ms passed before the job started", job.id)
            self._refuse(nxt, arrived, error, raw, owned=True)
            return
        if self.isolation.must_wait(suspect):
            add_release(nxt, cfg, job.id)
            self.isolation.hold(arrived)
            return
        nxt.add(lambda p: p.hincrby(cfg.keys.attempts, job.id, 1))
        if suspect:
            nxt.add(lambda p: p.hset(cfg.keys.attempts, alone_field(job.id), 1))
        try:
            self._start(job, resume.prior_lists(job.n or 1))
        except JobError as error:
            self._refuse(nxt, arrived, error, raw, owned=True)
            return
        state = InFlight(
            job=job,
            entry_id=arrived.entry_id,
            enqueued_ms=float(arrived.entry_id.split(b"-")[0]),
            admitted_ms=now_ms,
            n=job.n or 1,
            next_seq=resume.next_seq,
        )
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

    def _start(self, job: Job, prior: list[list[int]] | None) -> None:
        try:
            params = SamplingParams(**job.sampling_kwargs())
        except ValidationError as exc:
            first = exc.errors(include_url=False, include_input=False)[0]
            where = ".".join(map(str, first["loc"])) or "params"
            raise JobError(ErrorCode.INVALID_PARAMS, f"{where}: {first['msg']}", job.id) from None
        try:
            # The engine templates, tokenizes and checks the prompt's length and any response_format /
            # structured_outputs (parsed by the grammar engine: invalid_params); the worker never tokenizes.
            self.engine.add_request(
                job.id,
                _prompt(job),
                params,
                priority=job.priority,
                prior_output_token_ids=prior,
                max_tokens_cap=self.cfg.limits.max_tokens,  # for max_tokens=None (until the context is full)
            )
        except RequestRejected as rejected:
            raise job_error(rejected, job.id) from None
        except Exception as exc:  # an engine bug must not take the worker down with it
            log.exception("add_request failed", request_id=job.id)
            raise JobError(ErrorCode.INTERNAL, f"{type(exc).__name__}: {exc}", job.id) from None

    def _refuse(self, rnd: Round, arrived: Arrived, error: JobError, raw: bytes | None, owned: bool) -> None:
        log.warning("job refused", request_id=error.job_id, code=error.code.value, reason=error.message)
        add_failure(rnd, self.cfg, arrived.entry_id, error, raw, owned)
        self.on_outcome(error.code.value)


def _prompt(job: Job) -> Prompt:
    """The job's prompt as the engine takes it: token ids, text, or chat messages (exactly one is set)."""
    if job.prompt_token_ids is not None:
        return list(job.prompt_token_ids)
    if job.messages is not None:
        return Chat([m.model_dump() for m in job.messages])
    assert job.prompt is not None  # the protocol model requires exactly one of the three
    return job.prompt

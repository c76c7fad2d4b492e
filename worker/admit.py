"""Admission: from a stream entry to a request in the engine, or to an error event, in two round trips'
worth of commands folded into the loop's rounds.

Round k (this module's `add`): parse the payload; then for a well-formed job, in the same round
    SET owner NX GET (lease.py), HGET attempts, XRANGE out:<id> (resume.py), EXISTS cancel:<id>.
Dispatch of round k (`_decide`): run it, resume it, or refuse it; what to write goes into round k+1,
including HINCRBY attempts for a job that runs (round k+1 is sent before the step that runs it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog
from pydantic import ValidationError

from worker.config import WorkerConfig
from worker.errors import ErrorCode, JobError
from worker.intake import parse_entry
from worker.keys import JOB_FIELD
from worker.lease import add_acquire, add_release
from worker.limits import check_prompt_tokens
from worker.protocol import Job
from worker.publish import add_ack, add_failure
from worker.resume import read_resume
from worker.round import Round
from worker.state import InFlight

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
        engine,
        next_round: Callable[[], Round],
        running: Callable[[str], InFlight | None],
        on_admitted: Callable[[InFlight], None],
        on_outcome: Callable[[str], None],
    ) -> None:
        self.cfg, self.engine = cfg, engine
        self.next_round, self.running = next_round, running
        self.on_admitted, self.on_outcome = on_admitted, on_outcome

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
        add_acquire(rnd, cfg, job.id, replies.append)
        rnd.add(lambda p: p.hget(cfg.keys.attempts, job.id), replies.append)
        rnd.add(lambda p: p.xrange(out, count=cfg.stream_maxlen), replies.append)
        rnd.add(lambda p: p.exists(cancel), lambda r: self._decide(arrived, job, raw, [*replies, r]))

    def _decide(self, arrived: Arrived, job: Job, raw: bytes | None, replies: list) -> None:
        try:
            self._decide_or_raise(arrived, job, raw, replies)
        except Exception as exc:  # whatever a client sent, the worker goes on serving
            log.exception("unexpected error admitting a job", request_id=job.id)
            error = JobError(ErrorCode.INTERNAL, f"{type(exc).__name__}: {exc}"[:500], job.id)
            self._refuse(self.next_round(), arrived, error, raw, owned=True)

    def _decide_or_raise(self, arrived: Arrived, job: Job, raw: bytes | None, replies: list) -> None:
        cfg, nxt = self.cfg, self.next_round()
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
            nxt.add(lambda p: p.hdel(cfg.keys.attempts, job.id))
            self.on_outcome("duplicate")
            return
        now_ms = time.time() * 1000
        # This is an attempt: counted in the next round, which is sent before the step that runs the job,
        # so a crash while running it counts (like arq). Duplicates never reach this point.
        attempts = int(started or 0) + 1
        if attempts > cfg.max_attempts:
            error = JobError(ErrorCode.TOO_MANY_ATTEMPTS, f"{attempts - 1} attempts did not finish", job.id)
            self._refuse(nxt, arrived, error, raw, owned=True)
            return
        if job.deadline_ms is not None and job.deadline_ms <= now_ms:
            error = JobError(ErrorCode.DEADLINE_EXCEEDED, "deadline_ms passed before the job started", job.id)
            self._refuse(nxt, arrived, error, raw, owned=True)
            return
        nxt.add(lambda p: p.hincrby(cfg.keys.attempts, job.id, 1))
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
        from engine.sampling_params import SamplingParams

        try:
            params = SamplingParams(**job.sampling_kwargs())
        except ValidationError as exc:
            first = exc.errors(include_url=False, include_input=False)[0]
            where = ".".join(map(str, first["loc"])) or "params"
            raise JobError(ErrorCode.INVALID_PARAMS, f"{where}: {first['msg']}", job.id) from None
        if params.grammar_spec is not None:
            try:  # the grammar engine parses the schema/regex/grammar; its compile runs later, off the loop
                self.engine.check_structured(params)
            except ValueError as exc:
                raise JobError(ErrorCode.INVALID_PARAMS, str(exc), job.id) from None
        prompt = self._prompt(job)
        try:
            self.engine.add_request(
                job.id, prompt, params, priority=job.priority, prior_output_token_ids=prior
            )
        except ValueError as exc:  # engine.RequestRejected is a ValueError
            raise JobError(ErrorCode.REJECTED, str(exc) or type(exc).__name__, job.id) from None
        except Exception as exc:  # an engine bug must not take the worker down with it
            log.exception("add_request failed", request_id=job.id)
            raise JobError(ErrorCode.INTERNAL, f"{type(exc).__name__}: {exc}", job.id) from None

    def _prompt(self, job: Job) -> str | list[int]:
        limit = self.engine.max_model_len - 1  # room for at least one generated token
        if self.cfg.limits.max_prompt_tokens is not None:
            limit = min(limit, self.cfg.limits.max_prompt_tokens)
        tokenizer = self.engine.tokenizer
        if job.prompt_token_ids is not None:
            check_prompt_tokens(len(job.prompt_token_ids), limit, job.id)
            return list(job.prompt_token_ids)
        if job.messages is not None:
            try:
                prompt = self.engine.apply_chat_template([m.model_dump() for m in job.messages])
            except Exception as exc:
                raise JobError(ErrorCode.INVALID_JOB, f"messages: {exc}", job.id) from None
        else:
            prompt = job.prompt
        # A token covers at least one byte, so a short prompt needs no tokenizing here (the engine will).
        if len(prompt.encode()) + 2 > limit:
            check_prompt_tokens(len(tokenizer.encode(prompt)), limit, job.id)
        return prompt

    def _refuse(self, rnd: Round, arrived: Arrived, error: JobError, raw: bytes | None, owned: bool) -> None:
        log.warning("job refused", request_id=error.job_id, code=error.code.value, reason=error.message)
        add_failure(rnd, self.cfg, arrived.entry_id, error, raw, owned)
        self.on_outcome(error.code.value)

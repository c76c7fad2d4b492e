"""The worker's main loop: intake, step, publish, ack, heartbeat/reclaim (rq's `work()`, for streams).

    while running:
        abort cancelled and overdue jobs            (in memory)
        build one round: last step's events + acks, admissions, new reads, cancel keys, lease renewal
        run the round on the I/O thread  ||  engine.step()     (the engine never waits on Redis)
        dispatch the round's replies (admit jobs), turn the step's deltas into the next round's events

An idle engine blocks in XREADGROUP instead (wait_for_jobs). Reads ask only for as many jobs as the
engine has room for, so a busy worker leaves work to idle ones.
"""

from __future__ import annotations

import gc
import math
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import redis
import structlog

from worker.admit import Admitter, Arrived
from worker.cancel import CancelListener
from worker.config import WorkerConfig
from worker.connection import DOWN_ERRORS, Backoff, with_retry
from worker.events import done_event, error_event, token_event
from worker.lease import add_release, add_renewal
from worker.metrics import Metrics
from worker.publish import Batch, Publisher
from worker.reclaim import Reclaimer
from worker.round import Round
from worker.state import InFlight

log = structlog.get_logger("conveyor.worker")


class StopFlag:
    """Set by signal handlers (which do nothing else): first a warm stop (drain), then a cold one."""

    def __init__(self) -> None:
        self.warm = threading.Event()
        self.cold = threading.Event()

    def request(self) -> None:
        (self.cold if self.warm.is_set() else self.warm).set()


class Worker:
    def __init__(
        self, engine, client: redis.Redis, cfg: WorkerConfig, metrics: Metrics | None = None
    ) -> None:
        self.engine, self.client, self.cfg = engine, client, cfg
        self.metrics = metrics or Metrics({"consumer": cfg.consumer})
        self.stop = StopFlag()
        self.inflight: dict[str, InFlight] = {}
        self.arrived: list[Arrived] = []
        self.next = Round()
        self.cancels = CancelListener(client, cfg.keys.cancel_channel)
        self.reclaimer = Reclaimer(cfg)
        self.publisher = Publisher(self._lost, lambda: self.next)
        self.admitter = Admitter(
            cfg, engine, lambda: self.next, self.inflight.get, self._admitted, self.metrics.job
        )
        self.io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="conveyor-io")
        self.backoff = Backoff()
        self.publish_latencies: deque[float] = deque(maxlen=100_000)  # seconds, for benchmarks
        # Benchmarks set a list here to get (job id, sample, index, time.time()) of each token event.
        self.trace: list | None = None
        self._unmatched_cancels: dict[str, float] = {}
        self._admitting = 0  # jobs whose admission commands are in flight
        self._last_heartbeat = self._last_reclaim = self._last_rate = time.monotonic()
        self._tokens_since_rate = 0
        self._drain_deadline: float | None = None

    # ---- the loop -------------------------------------------------------------------------------------
    def run(self) -> None:
        self.start()
        try:
            while not self.stop.cold.is_set():
                if self.stop.warm.is_set() and self._drain_deadline is None:
                    self._begin_drain()
                if self._drain_deadline is not None and (
                    not self.inflight or time.monotonic() > self._drain_deadline
                ):
                    break
                self.tick()
        finally:
            self._shutdown()

    def tick(self) -> None:
        """One pass of the loop: a step with its round, or an idle wait. Tests drive workers with it."""
        self._abort_cancelled_and_overdue()
        busy = self.engine.has_unfinished_requests()
        if not busy and not (self.inflight or self.arrived or len(self.next) or self._heartbeat_due()):
            self._wait_for_jobs()
            return
        rnd = self._build_round(busy)
        sent = self._send(rnd)
        # Redis applies the round while the engine computes; replies are read on the I/O thread.
        future = self.io.submit(rnd.receive, sent) if sent is not None else None
        deltas = self.engine.step() if busy else []
        sampled_at, sampled_wall = time.perf_counter(), time.time()
        rnd.dispatch(self._results(rnd, future))
        self._publish(deltas, sampled_at, sampled_wall)
        self._observe(deltas)

    def start(self) -> None:
        # The model and tokenizer are millions of long-lived objects: a full collection walking them
        # stalled the loop for ~200 ms mid-generation. Freezing moves them out of the collector's view.
        gc.collect()
        gc.freeze()
        self._ensure_group()
        self.cancels.start()
        # A worker restarted under the same name first finishes what is still pending under that name.
        self.arrived.extend(self._read_own_pending())
        log.info(
            "worker started",
            consumer=self.cfg.consumer,
            group=self.cfg.group,
            stream=self.cfg.keys.requests,
            pending_resumed=len(self.arrived),
        )

    def _build_round(self, busy: bool) -> Round:
        rnd, self.next = self.next, Round()
        now = time.monotonic()
        draining = self._drain_deadline is not None
        # Draining: jobs read but not started stay pending, for another worker (or this one, restarted).
        for arrived in [] if draining else self.arrived:
            self.admitter.add(rnd, arrived)
        self._admitting, self.arrived = (0 if draining else len(self.arrived)), []
        room = 0 if draining else self._room()
        if room > 0:
            self._add_read(rnd, room, block_ms=None)
        if self._heartbeat_due():
            self._last_heartbeat = now
            add_renewal(rnd, self.cfg, self.inflight.values())
            self._add_queue_depth(rnd)
            if room > 0:
                self.reclaimer.add(rnd, room, self._arrive_reclaimed)
        if self.inflight:
            ids = list(self.inflight)
            keys = [self.cfg.keys.cancel(i) for i in ids]
            rnd.add(lambda p: p.mget(keys), lambda r: self._cancel_keys(ids, r))
        return rnd

    def _heartbeat_due(self) -> bool:
        return time.monotonic() - self._last_heartbeat >= self.cfg.heartbeat_s

    def _send(self, rnd: Round):
        if not len(rnd):
            return None
        return with_retry(
            lambda: rnd.send(self.client), "sending a round", self.stop.cold.is_set, self.backoff
        )

    def _results(self, rnd: Round, future) -> list:
        if future is None:
            return []
        try:
            results = future.result()
        except DOWN_ERRORS:
            # The connection broke mid-round: send it again (publish.py tolerates events that landed).
            results = with_retry(
                lambda: rnd.execute(self.client), "step round", self.stop.cold.is_set, self.backoff
            )
        if rnd.sampled_at is not None and rnd.answered_at is not None:
            # Read on the I/O thread while the engine stepped: not when this loop got to look at it.
            latency = rnd.answered_at - rnd.sampled_at
            self.publish_latencies.append(latency)
            self.metrics.publish_latency.observe(latency)
        if any(isinstance(r, redis.ResponseError) and str(r).startswith("NOGROUP") for r in results):
            self._ensure_group()  # Redis restarted without persistence: the group is gone
        return results

    # ---- intake ---------------------------------------------------------------------------------------
    def _room(self) -> int:
        """Jobs this worker can start now: free sequence slots, and KV blocks at the current per-job use."""
        stats = self.engine.stats()
        if stats.num_waiting > 0:
            return 0
        free_slots, free_blocks = self.engine.free_capacity()
        per_job = max(1, math.ceil(stats.num_kv_blocks_used / stats.num_running)) if stats.num_running else 1
        return max(0, min(free_slots, free_blocks // per_job) - self._admitting - len(self.arrived))

    def _add_read(self, rnd: Round, count: int, block_ms: int | None) -> None:
        cfg = self.cfg
        rnd.add(
            lambda p: p.xreadgroup(
                cfg.group, cfg.consumer, {cfg.keys.requests: ">"}, count=count, block=block_ms
            ),
            self._arrive_new,
        )

    def _arrive_new(self, reply) -> None:
        if isinstance(reply, Exception):
            if str(reply).startswith("NOGROUP"):
                return
            raise reply
        for _stream, entries in reply or []:
            self.arrived.extend(Arrived(eid, fields) for eid, fields in entries)

    def _arrive_reclaimed(self, entries) -> None:
        if entries:
            log.info("claimed jobs of a lapsed lease", count=len(entries))
        self.arrived.extend(Arrived(eid, fields, reclaimed=True) for eid, fields in entries)

    def _wait_for_jobs(self) -> None:
        """Idle: block on XREADGROUP, then gather for up to max_wait_ms to fill the first batch."""
        room = self._room()
        if room <= 0 or self.stop.warm.is_set():
            self.stop.cold.wait(0.01)
            return
        rnd = Round()
        self._add_read(rnd, room, block_ms=self.cfg.block_ms)
        rnd.dispatch(self._blocking(rnd))
        if not self.arrived or self.cfg.max_wait_ms <= 0:
            return
        deadline = time.monotonic() + self.cfg.max_wait_ms / 1000
        while len(self.arrived) < room and (left := deadline - time.monotonic()) > 0:
            rnd = Round()
            self._add_read(rnd, room - len(self.arrived), block_ms=max(1, int(left * 1000)))
            rnd.dispatch(self._blocking(rnd))

    def _blocking(self, rnd: Round) -> list:
        # Blocking reads cannot run inside MULTI; a plain pipeline of one command.
        def once() -> list:
            pipe = self.client.pipeline(transaction=False)
            for args, options in rnd.stack:
                pipe.execute_command(*args, **options)
            return pipe.execute(raise_on_error=False)

        results = with_retry(once, "waiting for jobs", self.stop.cold.is_set, self.backoff)
        if any(isinstance(r, redis.ResponseError) and str(r).startswith("NOGROUP") for r in results):
            self._ensure_group()
        return results

    def _read_own_pending(self) -> list[Arrived]:
        cfg, found, start = self.cfg, [], b"0"
        while True:
            reply = with_retry(
                lambda s=start: self.client.xreadgroup(
                    cfg.group, cfg.consumer, {cfg.keys.requests: s}, count=500
                ),
                "reading own pending entries",
                self.stop.cold.is_set,
            )
            entries = reply[0][1] if reply else []
            if not entries:
                return found
            found.extend(Arrived(eid, fields, reclaimed=True) for eid, fields in entries)
            start = entries[-1][0]

    def _ensure_group(self) -> None:
        def create() -> None:
            try:
                self.client.xgroup_create(self.cfg.keys.requests, self.cfg.group, id="0", mkstream=True)
                log.info("consumer group created", group=self.cfg.group, stream=self.cfg.keys.requests)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

        with_retry(create, "creating the consumer group", self.stop.cold.is_set)

    def _admitted(self, job: InFlight) -> None:
        self.inflight[job.job_id] = job
        self.metrics.queue_time.observe(max(0.0, job.admitted_ms - job.enqueued_ms) / 1000)
        log.debug("job admitted", request_id=job.job_id)
        cancelled_at = self._unmatched_cancels.pop(job.job_id, None)
        if cancelled_at is not None and self.engine.abort(job.job_id):
            job.stop_reason = "cancel"

    # ---- cancel, deadline -----------------------------------------------------------------------------
    def _abort_cancelled_and_overdue(self) -> None:
        now = time.monotonic()
        for job_id in self.cancels.take():
            if job_id in self.inflight:
                self._abort(self.inflight[job_id], "cancel")
            else:  # maybe read but not admitted yet: remember it a little while
                self._unmatched_cancels[job_id] = now
        self._unmatched_cancels = {k: t for k, t in self._unmatched_cancels.items() if now - t < 30}
        now_ms = time.time() * 1000
        for job in self.inflight.values():
            if job.job.deadline_ms is not None and job.job.deadline_ms <= now_ms:
                self._abort(job, "deadline")

    def _cancel_keys(self, ids: list[str], reply) -> None:
        if isinstance(reply, Exception):
            return
        for job_id, value in zip(ids, reply, strict=False):
            if value is not None and job_id in self.inflight:
                self._abort(self.inflight[job_id], "cancel")

    def _abort(self, job: InFlight, reason: str) -> None:
        if job.stop_reason is None and not job.dropped and self.engine.abort(job.job_id):
            job.stop_reason = reason
            log.info("job aborted", request_id=job.job_id, reason=reason)

    def _lost(self, job: InFlight) -> None:
        """Another worker wrote to this job's stream first: it owns the job now. Stop without a trace."""
        if not job.dropped:
            log.warning("job taken over by another worker, dropping it", request_id=job.job_id)
            job.dropped = True
            if not self.engine.abort(job.job_id):
                self.inflight.pop(job.job_id, None)

    # ---- publish, ack ---------------------------------------------------------------------------------
    def _publish(self, deltas, sampled_at: float, sampled_wall: float) -> None:
        if not deltas:
            return
        rnd, now_ms = self.next, time.time() * 1000
        by_job: dict[str, list[bytes]] = {}
        done: list[InFlight] = []
        for delta in deltas:
            job = self.inflight.get(delta.request_id)
            if job is None:
                continue
            if delta.finished:
                job.finished[delta.sample_index] = (
                    delta.finish_reason,
                    delta.text or "",
                    delta.num_output_tokens,
                )
                job.prompt_tokens = max(job.prompt_tokens, delta.num_prompt_tokens)
                job.error = job.error or getattr(delta, "error", None)
            if job.dropped:
                if len(job.finished) == job.n:
                    self.inflight.pop(job.job_id, None)
                continue
            if delta.new_token_ids or delta.text_delta:
                by_job.setdefault(job.job_id, []).append(token_event(delta, job.n))
                if self.trace is not None:
                    self.trace.append((job.job_id, delta.sample_index, delta.first_index, sampled_wall))
                if job.first_token_ms is None and delta.new_token_ids:
                    job.first_token_ms = now_ms
                    self.metrics.ttft.observe(max(0.0, now_ms - job.enqueued_ms) / 1000)
            if delta.finished and len(job.finished) == job.n:
                done.append(job)
        if by_job:
            rnd.sampled_at = sampled_at
        batch = Batch(self.cfg)
        for job in done:
            # The ack rides in the same script call, only if the terminal event was written (publish.py).
            last = error_event("invalid_params", job.error) if job.error else done_event(job, now_ms)
            batch.add(job, [*by_job.pop(job.job_id, ()), last], terminal=True)
        for job_id, payloads in by_job.items():
            batch.add(self.inflight[job_id], payloads)
        for job in done:
            del self.inflight[job.job_id]
            self._finished(job, now_ms)
        self.publisher.add(rnd, batch)

    def _finished(self, job: InFlight, now_ms: float) -> None:
        reason = job.finished[0][0]
        outcome = job.stop_reason if reason == "abort" and job.stop_reason else reason
        self.metrics.job(outcome)
        tokens = sum(s[2] for s in job.finished.values())
        if job.first_token_ms is not None and tokens > 1:
            self.metrics.tpot.observe((now_ms - job.first_token_ms) / 1000 / (tokens - 1))
        log.info("job finished", request_id=job.job_id, finish_reason=reason, completion_tokens=tokens)

    # ---- observe, drain, shutdown ---------------------------------------------------------------------
    def _observe(self, deltas) -> None:
        self._tokens_since_rate += sum(len(d.new_token_ids) for d in deltas)
        now = time.monotonic()
        if now - self._last_rate < 1.0:
            return
        stats = self.engine.stats()
        m = self.metrics
        m.running.set(stats.num_running)
        m.waiting.set(stats.num_waiting)
        m.kv_used.set(stats.num_kv_blocks_used)
        m.kv_total.set(stats.num_kv_blocks_total)
        m.tokens.inc(self._tokens_since_rate)
        m.tokens_per_s.set(self._tokens_since_rate / (now - self._last_rate))
        self._tokens_since_rate, self._last_rate = 0, now

    def _add_queue_depth(self, rnd: Round) -> None:
        def handle(reply) -> None:
            if isinstance(reply, Exception):
                return
            for group in reply:
                if group.get("name") == self.cfg.group.encode():
                    self.metrics.queue_depth.set(group.get("lag") or 0)
                    self.metrics.pending.set(group.get("pending") or 0)

        rnd.add(lambda p: p.xinfo_groups(self.cfg.keys.requests), handle)

    def _begin_drain(self) -> None:
        self._drain_deadline = time.monotonic() + self.cfg.drain_timeout_s
        log.info("draining: no new jobs", in_flight=len(self.inflight), timeout_s=self.cfg.drain_timeout_s)

    def _shutdown(self) -> None:
        left = [j for j in self.inflight.values() if not j.dropped]
        # Events already produced are written; unfinished jobs stay unacknowledged for another worker,
        # and their owner keys go so it need not wait for them to expire.
        rnd, self.next = self.next, Round()
        for job in left:
            add_release(rnd, self.cfg, job.job_id)
        if len(rnd) and not self.stop.cold.is_set():
            try:
                rnd.execute(self.client)
            except DOWN_ERRORS as exc:
                log.warning("could not write the last round", error=str(exc))
        for job in left:
            self.engine.abort(job.job_id)
        self.cancels.stop()
        self.io.shutdown(wait=True)
        gc.unfreeze()
        log.info("worker stopped", left_unacknowledged=len(left))

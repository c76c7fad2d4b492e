"""The worker's main loop: intake, step, publish, ack, heartbeat/reclaim (rq's `work()`, for streams).
Paths below are under worker/.

    while running:
        abort cancelled and overdue jobs                                  (run/aborts.py, in memory)
        build this step's round (wire/round.py):
            what the last round's replies and step owe   (job_path.py: attempt counts, refusals, acks;
                                                          publish/publisher.py: the step's events)
            the lookups of the jobs read                 (job_path.py)
            a read for this lane's share of the room     (intake/stream_reader.py, intake/read_policy.py)
            leases, reclaims, trimming, cancel keys      (run/job_lease.py, run/consumer_lease.py,
                                                          recover/takeover_claim.py, intake/stream_trim.py)
        the round on the I/O thread (wire/)  ||  engine.step()
            (the engine never waits on Redis, except for a round that counts an attempt: that one is
            answered before the step that runs the job)
        each reply to whoever sent its command (jobs move on a stage), then the step's events

A job's path from XREADGROUP to XACK: intake/stream_reader.py, job_path.py, publish/publisher.py. An idle
engine blocks in XREADGROUP instead (Reader.wait). Redis unreachable or full: the round is sent again
with back-off until it goes through (connection.py), nothing is admitted meanwhile, and a stop request
still ends the loop within the drain timeout (run/stop.py).
"""

from __future__ import annotations

import gc
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from concurrent.futures import TimeoutError as FutureTimeout
from typing import NamedTuple

import redis
import structlog

from engine.client import EngineClient
from engine.outputs import StepDelta
from worker.config import WorkerConfig
from worker.connection import DOWN_ERRORS, Backoff, with_retry
from worker.fleet.accounting import split_step
from worker.intake.read_policy import OneLane, ReadPolicy
from worker.intake.stream_reader import Reader
from worker.intake.stream_trim import Trimmer
from worker.job_path import JobPath
from worker.publish.publisher import Publisher, plan_events
from worker.recover.redis_health import RedisHealth
from worker.recover.takeover_claim import Reclaimer
from worker.run.aborts import Aborter
from worker.run.cancel_listener import CancelListener
from worker.run.consumer_lease import ConsumerLease
from worker.run.engine_room import engine_room
from worker.run.hooks import NO_HOOKS, Hooks
from worker.run.isolation import Isolation, add_refund
from worker.run.job_lease import add_release, add_renewal
from worker.run.metrics import Metrics
from worker.run.observer import Observer
from worker.run.stop import IdleStop, StopFlag, StopRequested
from worker.wire.exchange import cut_off, execute, no_resends
from worker.wire.job_record import Arrived, InFlight
from worker.wire.round import Round

log = structlog.get_logger("conveyor.worker")
_REDIS_FAILURES = (*DOWN_ERRORS, redis.OutOfMemoryError)
LAST_WRITE_S = 2.0  # the last round at a stop, at most: then the sockets are cut (a frozen network)


class Step(NamedTuple):
    """One tick's round (sent while the engine steps) and what the tick does."""

    rnd: Round
    busy: bool  # the engine has work: step it
    reads: int  # new jobs asked for in `rnd`


class Stepped(NamedTuple):
    deltas: list[StepDelta]
    at: float  # time.perf_counter() when they were sampled


class Worker:
    def __init__(
        self,
        engine: EngineClient,
        client: redis.Redis,
        cfg: WorkerConfig,
        observer: Observer | None = None,
        stop: StopFlag | None = None,
        hooks: Hooks = NO_HOOKS,
    ) -> None:
        self.engine, self.client, self.cfg = engine, no_resends(client), cfg
        self.observer = observer or Observer(Metrics({"consumer": cfg.consumer}))
        self.hooks = hooks  # tests' and benchmarks' view of each step (run/hooks.py)
        # Time its engine steps for accounting; off under a lanes worker, which times the shared step.
        self.accounts_steps = True
        # Shared by the lanes' workers of a lanes worker (run/lanes_worker.py).
        self.stop = stop or StopFlag(cfg.drain_timeout_s)
        # Past the drain time, a read hanging on a frozen network must not hold the stop (stop.py).
        self._cut_off = lambda: cut_off(client)
        self.stop.on_expired(self._cut_off)
        self.health = RedisHealth(self.observer.redis_full)
        self.inflight: dict[str, InFlight] = {}
        self.isolation = Isolation(self.inflight)  # jobs that survived a crash run alone
        self.arrived: list[Arrived] = []  # READ: looked up in the next round (job_path.py)
        self.cancels = CancelListener(client, cfg.keys.cancel_channel, sharded=cfg.cluster)
        self.aborter = Aborter(engine, self.inflight, self.cancels, cfg)
        self.reader = Reader(client, cfg, self.stop, IdleStop(self.stop), self.health)
        # This worker's lane is cfg.keys.requests read through cfg.group (lanes.single_stream). A worker
        # over several lanes runs one Worker per lane and passes each its share (run/lanes_worker.py).
        self.policy: ReadPolicy = OneLane()
        self.reclaimer = Reclaimer(cfg)
        self.trimmer = Trimmer(cfg.keys.requests)
        self.consumer_lease = ConsumerLease(client, cfg)
        self.path = JobPath(cfg, engine, self.observer)
        self.publisher = Publisher(self._lost, self._full, self.path.acknowledged, sharded_pubsub=cfg.cluster)
        self.io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="conveyor-io")
        self.backoff = Backoff()
        self._admitting = 0  # jobs whose admission commands are in flight
        self._reading = 0  # new jobs asked for in the round in flight
        self._last_heartbeat = time.monotonic()
        self._started = False
        self._redis_lost = False  # stopped while Redis was unreachable or full: write nothing more
        self._refused_for_memory = False  # in the round being dispatched
        self._events_sampled_at: float | None = None  # of the newest token events owed to Redis
        self.refused: str | None = None  # Redis refused a command for lack of permission (ACL): why

    @property
    def metrics(self) -> Metrics:
        return self.observer.metrics

    # ---- the loop -------------------------------------------------------------------------------------
    def run(self) -> None:
        try:
            self.start()
            drain_logged = False
            while not self.stop.cold.is_set():
                if self.stop.warm.is_set():
                    if not drain_logged:
                        drain_logged = True
                        log.info(
                            "draining: no new jobs",
                            in_flight=len(self.inflight),
                            timeout_s=self.cfg.drain_timeout_s,
                        )
                    if not self.inflight or self.stop.expired():
                        break
                self.tick()
        except StopRequested as exc:
            self._redis_lost = True
            log.warning("stopping while Redis is unavailable or full", error=str(exc))
        except redis.exceptions.NoPermissionError as exc:
            # Waiting will not help and every later round would be refused too: stop writing, exit.
            self._redis_lost, self.refused = True, str(exc)
            log.error(
                "redis refused a command (ACL): grant the worker's commands, docs/operations.md Security",
                error=str(exc),
            )
        finally:
            self.shutdown()

    def tick(self) -> None:
        """One pass of the loop: a step with its round, or an idle wait. Tests drive workers with it."""
        step = self.begin()
        if step is None:
            return
        # Redis applies the round while the engine computes: it is sent and answered on the I/O thread.
        future = self.io.submit(execute, self.client, step.rnd) if len(step.rnd) else None
        if future is not None and step.rnd.before_step:
            wait([future])  # it counts an attempt: in Redis before the step that runs the job
        self.finish(step, future, self.step_engine(step))

    # A tick in three parts, so that a lanes worker can send every lane's round of a cycle to each Redis
    # node in one write (run/lanes_worker.py): begin, send, step_engine, finish.
    def begin(
        self, max_reads: int | None = None, wait: bool = True, max_waited: int | None = None
    ) -> Step | None:
        """Apply signals, then either wait idle for jobs (returns None) or build this step's round. At
        most `max_reads` new jobs are read in it (default: as many as there is room for), and at most
        `max_waited` by an idle wait (default: the room). With `wait=False` it never waits: an idle
        worker builds a round too (reads only, or nothing), for a lanes worker whose other lanes have
        work (run/lanes_worker.py)."""
        self.aborter.apply_signals()
        busy = self.engine.has_unfinished_requests()
        if wait and not busy and not self.has_work():
            self._wait_for_jobs(max_waited)
            return None
        if self.health.is_full:
            # Hold: no step (its events would pile up in memory), no new reads; after a back-off, send
            # again what is owed (the refused events, in order, and refused admissions).
            self.stop.sleep(self.backoff.next_delay())
            busy = False
        return Step(self._build_round(max_reads), busy, self._reading)

    def step_engine(self, step: Step) -> Stepped:
        began = time.perf_counter()
        deltas = self.engine.step() if step.busy else []
        at = time.perf_counter()
        if step.busy and self.accounts_steps:
            self.observer.engine_stepped(at - began)
            self.credit(at - began, self.engine.step_tokens())
        self.hooks.stepped(deltas, time.time())
        return Stepped(deltas, at)

    def credit(self, wall_s: float, tokens: dict[str, int]) -> None:
        """Each of our jobs' share of a step's wall time, by the tokens it computed among all the step's
        (worker/fleet/accounting.py)."""
        for job_id, seconds in split_step(wall_s, tokens).items():
            if (job := self.inflight.get(job_id)) is not None:
                job.engine_s += seconds

    def finish(self, step: Step, future: Future | None, stepped: Stepped) -> None:
        """The round's replies (from `future`: None when nothing was sent) to the jobs and parts that sent
        its commands, then the step's events (owed to the next round)."""
        self._refused_for_memory = False
        step.rnd.dispatch(self._results(step.rnd, future))
        self._settle()
        if step.reads:
            self.policy.read_back(0, step.reads, len(self.arrived))
        self._reading = self._admitting = 0
        if self.health.is_full and not self._refused_for_memory:
            self.health.ok()
            self.backoff.reset()
        self._publish(stepped.deltas, stepped.at)
        self.observer.stepped(sum(len(d.new_token_ids) for d in stepped.deltas), self.engine, step.busy)

    def has_work(self) -> bool:
        """Jobs in flight or read, commands owed to Redis, or a heartbeat due: a round to send."""
        return bool(
            self.inflight or self.arrived or self.isolation.held or self.owes() or self._heartbeat_due()
        )

    def owes(self) -> bool:
        """Writes decided on replies or produced by a step, not sent yet."""
        return bool(self.path.owed or self.publisher.owed or self.consumer_lease.owed)

    def reserved(self) -> int:
        """Jobs read or being read and not yet added to the engine: room the engine has that is taken."""
        return self._admitting + len(self.arrived) + self._reading

    def start(self) -> None:
        # The model and tokenizer are millions of long-lived objects: a full collection walking them
        # stalled the loop for ~200 ms mid-generation. Freezing moves them out of the collector's view.
        gc.collect()
        gc.freeze()
        self._started = True
        self.consumer_lease.acquire(self.stop)
        self.reader.ensure_group()
        self.cancels.start()
        self.arrived.extend(self.reader.own_pending())
        self.observer.started()
        log.info(
            "worker started",
            consumer=self.cfg.consumer,
            group=self.cfg.group,
            stream=self.cfg.keys.requests,
            pending_resumed=len(self.arrived),
        )

    def _build_round(self, max_reads: int | None = None) -> Round:
        rnd = Round()
        self._add_owed(rnd)
        draining, full = self.stop.warm.is_set(), self.health.is_full
        self._admitting = 0
        if draining:  # jobs read but not started stay pending, for another worker (or this one, restarted)
            self.arrived, self.isolation.held = [], []
        else:
            self.arrived.extend(
                self.isolation.release()
            )  # (Redis full: refused again and kept for the next try, see _readmit)
            for arrived in self.arrived:
                self.path.look_up(rnd, arrived)
            self._admitting, self.arrived = len(self.arrived), []
        free = 0 if draining or full else self.room()
        room = self.policy.shares(free)[0] if max_reads is None else min(free, max_reads)
        self._reading = room  # until the replies are dispatched
        if room > 0:
            self.reader.add_new(rnd, room, self.arrived)
        if self._heartbeat_due():
            self._last_heartbeat = time.monotonic()
            add_renewal(rnd, self.cfg, self.inflight.values())
            self.consumer_lease.add_renewal(rnd)
            self._add_queue_depth(rnd)
            # Lapsed leases are claimed up to all the free room, not only this round's read share (every
            # shard would otherwise take over a dead worker's jobs only when it reads), and not reserved:
            # shards claiming together may start more than the engine runs at once; the rest waits in it.
            if free > 0:
                self.reclaimer.add(rnd, free, self._arrive_reclaimed)
        if self.trimmer.due():
            self.trimmer.add(rnd)
        self.aborter.add_key_check(rnd)
        return rnd

    def _add_owed(self, rnd: Round) -> None:
        """What the last round's replies and the last step decided to write: decisions on jobs, then the
        step's events (after any sent again), then a lease renewal Redis did not run."""
        self.path.add_owed(rnd)
        self.publisher.add_owed(rnd)
        self.consumer_lease.add_owed(rnd)
        rnd.sampled_at, self._events_sampled_at = self._events_sampled_at, None

    def _heartbeat_due(self) -> bool:
        return time.monotonic() - self._last_heartbeat >= self.cfg.heartbeat_s

    def _results(self, rnd: Round, future: Future | None) -> list:
        if future is None:
            return []
        try:
            results = future.result()
        except _REDIS_FAILURES as exc:
            # The connection broke mid-round, or Redis was full and refused the whole MULTI: send it again
            # (publish/publisher.py tolerates events that landed). Meanwhile nothing new is read or admitted.
            if isinstance(exc, redis.OutOfMemoryError):
                self._full(str(exc))
            else:
                log.warning("round failed, sending it again", error=str(exc))
            results = with_retry(
                lambda: execute(self.client, rnd), "step round", self.stop, self.backoff, self.health
            )
        if rnd.sampled_at is not None and rnd.answered_at is not None:
            # Read on the I/O thread while the engine stepped: not when this loop got to look at it.
            self.observer.published(rnd.answered_at - rnd.sampled_at)
            self.hooks.published(rnd.answered_at - rnd.sampled_at)
        if any(isinstance(r, redis.ResponseError) and str(r).startswith("NOGROUP") for r in results):
            self.reader.ensure_group()  # Redis restarted without persistence: the group is gone
        return results

    def _full(self, message: str) -> None:
        """A command of this round was refused for lack of memory (OOM under noeviction)."""
        self._refused_for_memory = True
        self.health.full("step round", RuntimeError(message), self.backoff.first_s * 2**self.backoff.failures)

    def _settle(self) -> None:
        """The jobs whose lookups were just answered: admitted, or what their decision owes is queued
        (job_path.py). Refused for lack of memory: the entry stays ours, admitted once Redis has room."""
        settled = self.path.settle(self.inflight, self.isolation, time.time() * 1000)
        for job in settled.admitted:
            self.observer.admitted(job)
            log.debug("job admitted", request_id=job.job_id)
            self.aborter.on_admitted(job)
        for arrived, error in settled.full:
            self.arrived.append(arrived)
            self._full(str(error))

    # ---- intake ---------------------------------------------------------------------------------------
    def room(self) -> int:
        """Jobs this worker can start now: free sequence slots, and KV blocks at the current per-job use."""
        if self.isolation.running_alone() or self.isolation.held:
            return 0
        return max(0, engine_room(self.engine, self.engine.stats()) - self._admitting - len(self.arrived))

    def _arrive_reclaimed(self, arrived: list[Arrived]) -> None:
        if arrived:
            log.info("claimed jobs of a lapsed lease", count=len(arrived))
        self.arrived.extend(arrived)

    def _wait_for_jobs(self, most: int | None = None) -> None:
        room = self.room() if most is None else min(most, self.room())
        if room <= 0 or self.stop.warm.is_set():
            self.stop.cold.wait(0.01)
            return
        self.reader.wait(room, self.arrived)

    def _lost(self, job: InFlight) -> None:
        self.path.left(job)
        self.aborter.lost(job)

    def _add_queue_depth(self, rnd: Round) -> None:
        def handle(reply) -> None:
            if isinstance(reply, Exception):
                return
            for group in reply:
                if group.get("name") == self.cfg.group.encode():
                    self.observer.group_info(group.get("lag") or 0, group.get("pending") or 0)

        rnd.add(lambda p: p.xinfo_groups(self.cfg.keys.requests), handle)

    # ---- publish --------------------------------------------------------------------------------------
    def _publish(self, deltas, sampled_at: float) -> None:
        if not deltas:
            return
        now_ms = time.time() * 1000
        plan = plan_events(deltas, self.inflight, self.cfg, now_ms)
        for job_id in plan.forget:
            self.inflight.pop(job_id, None)
        for job in plan.first_tokens:
            self.observer.first_token(job, now_ms)
        if plan.has_tokens:
            self._events_sampled_at = sampled_at
        for job in plan.done:
            if job.error:
                log.warning("job failed", request_id=job.job_id, code=job.error_code, reason=job.error)
            del self.inflight[job.job_id]
            self.path.finish(job)
            self.observer.finished(job, now_ms)
            self.observer.accounted(job, self.cfg.group)
        self.publisher.queue(plan.batch)

    # ---- shutdown -------------------------------------------------------------------------------------
    def _last_write(self, rnd: Round) -> None:
        def write() -> None:
            if len(rnd):
                execute(self.client, rnd)
            self.consumer_lease.release()

        future = self.io.submit(write)
        try:
            future.result(timeout=LAST_WRITE_S)
        except FutureTimeout:
            cut_off(self.client)  # the write's read fails at once
            future.result(timeout=LAST_WRITE_S)

    def forget_jobs(self) -> set[str]:
        """Redis lost this worker's last writes (its master failed over): forget every job and all that is
        owed to Redis, since the new master's state is the truth now, aborting the jobs in the engine
        (nothing is written for them). Returns the ids the engine still had: call `resume_pending()` once
        they have left it, as a worker restarted under the same name would."""
        aborted = {job.job_id for job in self.inflight.values() if self.engine.abort(job.job_id)}
        self.inflight.clear()
        self.arrived, self._admitting, self._reading = [], 0, 0
        self.isolation.held = []
        self.path.owed.clear()
        self.publisher.owed.clear()
        self.consumer_lease.owed = False
        self.backoff.reset()
        for script in (self.publisher.script, self.trimmer.script, self.consumer_lease.script):
            script.loaded = False  # the new master may not have them
        return aborted

    def resume_pending(self) -> None:
        """Take up this consumer's pending entries again (after forget_jobs)."""
        self.reader.ensure_group()
        self.arrived.extend(self.reader.own_pending())

    def shutdown(self, redis_lost: bool = False) -> None:
        """Write what is owed and release the jobs left (unless Redis is lost: then write nothing more).
        Safe on a worker that never started."""
        self._redis_lost = self._redis_lost or redis_lost
        # The loop has ended: the drain's cut-off is for a loop stuck in a read, not for the last write.
        self.stop.forget(self._cut_off)
        left = [j for j in self.inflight.values() if not j.dropped]
        # Events already produced are written; unfinished jobs stay unacknowledged for another worker,
        # and their owner keys go so it need not wait for them to expire.
        rnd = Round()
        self._add_owed(rnd)
        for job in left:
            add_release(rnd, self.cfg, job.job_id)
            add_refund(rnd, self.cfg, job.job_id)  # a warm stop is no crash (worker/run/isolation.py)
        if self._started and not self.stop.cold.is_set() and not self._redis_lost:
            try:
                self._last_write(rnd)
            except _REDIS_FAILURES as exc:
                log.warning("could not write the last round", error=str(exc))
        for job in left:
            self.engine.abort(job.job_id)
        if self._started:
            self.cancels.stop()
            gc.unfreeze()
        self.io.shutdown(wait=True)
        # Jobs read but not yet running (arrived, or in a round that never ran) are pending for us too.
        unacked = len(left) + len(self.arrived) + self._admitting
        log.info("worker stopped", left_unacknowledged=unacked)

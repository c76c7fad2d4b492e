"""One lane's share of the worker loop (run/loop.py): what must stay apart per lane, as data the loop
iterates over.

A lane (intake/lanes.py) is a request stream, its consumer group and its jobs' keys, on one Redis client
(one Redis: the same client for every lane; a cluster: the client of the master holding the lane's
shard). Each lane keeps its own consumer group reads, leases, XAUTOCLAIM takeover, dead letters,
trimming, cancel channel, jobs in flight, decisions owed (job_path.py) and events owed
(publish/publisher.py): every command of a lane's round stays on its client (in a cluster, one slot).
The loop gives each lane its share of the engine's room and of each step's deltas; a lane builds its
round (`build`) and takes the round's replies and its deltas (`finish`).
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import NamedTuple

import redis
import structlog

from engine.client import EngineClient
from engine.outputs import StepDelta
from worker.config import WorkerConfig
from worker.connection import DOWN_ERRORS, Backoff, with_retry
from worker.fleet.accounting import split_step
from worker.intake.stream_reader import Reader
from worker.intake.stream_trim import Trimmer
from worker.job_path import JobPath
from worker.publish.publisher import Publisher, plan_events
from worker.recover.redis_health import RedisHealth
from worker.recover.takeover_claim import Reclaimer
from worker.run.aborts import Aborter
from worker.run.cancel_listener import CancelListener
from worker.run.consumer_lease import ConsumerLease
from worker.run.hooks import Hooks
from worker.run.isolation import Isolation, add_refund
from worker.run.job_lease import add_release, add_renewal
from worker.run.observer import Observer
from worker.run.stop import IdleStop, StopFlag
from worker.wire.exchange import cut_off, execute, no_resends
from worker.wire.job_record import Arrived, InFlight
from worker.wire.round import Round

log = structlog.get_logger("conveyor.worker")
REDIS_FAILURES = (*DOWN_ERRORS, redis.OutOfMemoryError)
LAST_WRITE_S = 2.0  # the last round at a stop, at most: then the sockets are cut (a frozen network)


class Step(NamedTuple):
    """A lane's round for one tick (sent while the engine steps) and what the tick does for it."""

    rnd: Round
    busy: bool  # the lane takes a step's deltas (not while its Redis is full)
    reads: int  # new jobs asked for in `rnd`


class LaneServers:
    """How a lane's Redis can change under the worker. On one Redis it cannot: this base notices nothing.
    A cluster's shard fails over (run/build.py's ClusterFailover)."""

    # Raised by a lane's Redis calls when its server changed: the lane restarts from the new state.
    moved_errors: tuple[type[Exception], ...] = ()

    def moved(self, client: redis.Redis) -> bool:
        """Whether the lane's server changed since the last `accept_move` (checked before a round goes)."""
        return False

    def accept_move(self, client: redis.Redis) -> None:
        """Send the lane's commands to its new server from now on."""


class LaneRun:
    def __init__(
        self,
        engine: EngineClient,
        client: redis.Redis,
        cfg: WorkerConfig,
        observer: Observer,
        stop: StopFlag,
        hooks: Hooks,
    ) -> None:
        """`cfg` is the worker's with the lane's keys and group."""
        self.engine, self.client, self.cfg = engine, no_resends(client), cfg
        self.observer, self.stop, self.hooks = observer, stop, hooks
        # Past the drain time, a read hanging on a frozen network must not hold the stop (stop.py).
        self._cut_off = lambda: cut_off(client)
        self.stop.on_expired(self._cut_off)
        self.health = RedisHealth(self.observer.redis_full)
        self.inflight: dict[str, InFlight] = {}
        self.isolation = Isolation(self.inflight)  # jobs that survived a crash run alone
        self.arrived: list[Arrived] = []  # READ: looked up in the next round (job_path.py)
        self.bucket: list[StepDelta] = []  # this lane's deltas of a step, until it takes them
        self.cancels = CancelListener(client, cfg.keys.cancel_channel, sharded=cfg.cluster)
        self.aborter = Aborter(engine, self.inflight, self.cancels, cfg)
        self.reader = Reader(client, cfg, self.stop, IdleStop(self.stop), self.health)
        self.reclaimer = Reclaimer(cfg)
        self.trimmer = Trimmer(cfg.keys.requests)
        self.consumer_lease = ConsumerLease(client, cfg)
        self.path = JobPath(cfg, engine, self.observer)
        self.publisher = Publisher(self._lost, self._full, self.path.acknowledged, sharded_pubsub=cfg.cluster)
        self.backoff = Backoff()
        self._admitting = 0  # jobs whose admission commands are in flight
        self._reading = 0  # new jobs asked for in the round in flight
        self._last_heartbeat = time.monotonic()
        self.started = False
        self._refused_for_memory = False  # in the round being dispatched
        self._events_sampled_at: float | None = None  # of the newest token events owed to Redis

    @property
    def stream(self) -> str:
        return self.cfg.keys.requests

    def start(self) -> None:
        self.started = True
        self.consumer_lease.acquire(self.stop)
        self.reader.ensure_group()
        self.cancels.start()
        self.arrived.extend(self.reader.own_pending())
        log.info(
            "lane started",
            consumer=self.cfg.consumer,
            group=self.cfg.group,
            stream=self.stream,
            pending_resumed=len(self.arrived),
        )

    # ---- state the loop asks about ----------------------------------------------------------------------
    def has_work(self) -> bool:
        """Jobs in flight or read, commands owed to Redis, deltas to take or a heartbeat due: a round."""
        return bool(
            self.inflight
            or self.arrived
            or self.bucket
            or self.isolation.held
            or self.path.owed
            or self.publisher.owed
            or self.consumer_lease.owed
            or self._heartbeat_due()
        )

    def reserved(self) -> int:
        """Jobs read or being read and not yet added to the engine: room the engine has that is taken."""
        return self._admitting + len(self.arrived) + self._reading

    def blocked(self) -> bool:
        """A suspect runs alone here, or jobs wait for it to end: this lane starts nothing new."""
        return self.isolation.running_alone() or bool(self.isolation.held)

    def credit(self, wall_s: float, tokens: dict[str, int]) -> None:
        """Each of this lane's jobs' share of a step's wall time, by the tokens it computed among all the
        step's (worker/fleet/accounting.py)."""
        for job_id, seconds in split_step(wall_s, tokens).items():
            if (job := self.inflight.get(job_id)) is not None:
                job.engine_s += seconds

    # ---- a tick ---------------------------------------------------------------------------------------
    def wait(self, room: int) -> None:
        """Idle: block on this lane's stream for up to `room` jobs (the loop's wait, lane by lane)."""
        if room <= 0 or self.stop.warm.is_set():
            self.stop.cold.wait(0.01)
            return
        self.reader.wait(room, self.arrived)

    def build(self, free: int, share: int) -> Step:
        """This tick's round: what is owed, the lookups of the jobs read, a read of up to `share` new jobs,
        and the heartbeat's renewals and claims (up to `free`, the engine's room no lane has taken)."""
        self.aborter.apply_signals()
        busy = True
        if self.health.is_full:
            # Hold: no deltas taken (their events would pile up in memory), no new reads; after a back-off,
            # send again what is owed (the refused events, in order, and refused admissions).
            self.stop.sleep(self.backoff.next_delay())
            busy = False
        rnd = Round()
        self._add_owed(rnd)
        draining, full = self.stop.warm.is_set(), self.health.is_full
        self._admitting = 0
        if draining:  # jobs read but not started stay pending, for another worker (or this one, restarted)
            self.arrived, self.isolation.held = [], []
        else:
            # (Redis full: refused again and kept for the next try, see finish)
            self.arrived.extend(self.isolation.release())
            for arrived in self.arrived:
                self.path.look_up(rnd, arrived)
            self._admitting, self.arrived = len(self.arrived), []
        free = 0 if draining or full or self.blocked() else free
        room = min(free, share)
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
        return Step(rnd, busy, self._reading)

    def finish(self, step: Step, future: Future | None, sampled_at: float) -> list[StepDelta]:
        """The round's replies (from `future`: None when nothing was sent) to the jobs and parts that sent
        its commands, then this lane's deltas of the step turned into events (owed to the next round).
        Returns the deltas taken."""
        self._refused_for_memory = False
        step.rnd.dispatch(self._results(step.rnd, future))
        self._settle()
        self._reading = self._admitting = 0
        if self.health.is_full and not self._refused_for_memory:
            self.health.ok()
            self.backoff.reset()
        if not step.busy:
            return []
        deltas, self.bucket = self.bucket, []
        self._publish(deltas, sampled_at)
        return deltas

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
        except REDIS_FAILURES as exc:
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

    def _arrive_reclaimed(self, arrived: list[Arrived]) -> None:
        if arrived:
            log.info("claimed jobs of a lapsed lease", count=len(arrived))
        self.arrived.extend(arrived)

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

    def _publish(self, deltas: list[StepDelta], sampled_at: float) -> None:
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

    # ---- a lane whose server changed (a cluster shard's failover) ---------------------------------------
    def forget_jobs(self) -> dict[str, int]:
        """Redis lost this lane's last writes (its master failed over): forget every job and all that is
        owed to Redis, since the new master's state is the truth now, aborting the jobs in the engine
        (nothing is written for them). Returns, per job the engine still has, its samples not ended: call
        `resume_pending()` once they have left it, as a worker restarted under the same name would."""
        leaving: dict[str, int] = {}
        for job in self.inflight.values():
            ended = len(job.finished) + sum(d.finished for d in self.bucket if d.request_id == job.job_id)
            if self.engine.abort(job.job_id) and ended < job.n:
                leaving[job.job_id] = job.n - ended
        self.inflight.clear()
        self.bucket = []
        self.arrived, self._admitting, self._reading = [], 0, 0
        self.isolation.held = []
        self.path.owed.clear()
        self.path.looked.clear()
        self.publisher.owed.clear()
        self.consumer_lease.owed = False
        self.backoff.reset()
        for script in (self.publisher.script, self.trimmer.script, self.consumer_lease.script):
            script.loaded = False  # the new master may not have them
        return leaving

    def resume_pending(self) -> None:
        """Take up this consumer's pending entries again (after forget_jobs)."""
        self.reader.ensure_group()
        self.arrived.extend(self.reader.own_pending())

    # ---- shutdown -------------------------------------------------------------------------------------
    def shutdown(self, io: ThreadPoolExecutor, redis_lost: bool) -> int:
        """Write what is owed and release the jobs left (unless Redis is lost: then write nothing more).
        Safe on a lane that never started. Returns the entries it leaves unacknowledged."""
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
        if self.started and not self.stop.cold.is_set() and not redis_lost:
            try:
                self._last_write(io, rnd)
            except REDIS_FAILURES as exc:
                log.warning("could not write the last round", error=str(exc))
        for job in left:
            self.engine.abort(job.job_id)
        if self.started:
            self.cancels.stop()
        # Jobs read but not yet running (arrived, or in a round that never ran) are pending for us too.
        unacked = len(left) + len(self.arrived) + self._admitting
        log.info("lane stopped", stream=self.stream, left_unacknowledged=unacked)
        return unacked

    def _last_write(self, io: ThreadPoolExecutor, rnd: Round) -> None:
        def write() -> None:
            if len(rnd):
                execute(self.client, rnd)
            self.consumer_lease.release()

        future = io.submit(write)
        try:
            future.result(timeout=LAST_WRITE_S)
        except FutureTimeout:
            cut_off(self.client)  # the write's read fails at once
            future.result(timeout=LAST_WRITE_S)

"""The worker's one loop over its lanes: intake, step, publish, ack, heartbeat/reclaim (rq's `work()`, for
streams). Paths below are under worker/.

    while running:
        the hooks between ticks (a registry moving home shards, a tenant's new lane)
        per lane, in a rotating order (run/lane_run.py):
            abort cancelled and overdue jobs                              (run/aborts.py, in memory)
            build the lane's round (wire/round.py):
                what the last round's replies and step owe (job_path.py: attempt counts, refusals,
                                                            acks; publish/publisher.py: the events)
                the lookups of the jobs read                (job_path.py)
                a read for the lane's share of the room     (intake/stream_reader.py, the read policy)
                leases, reclaims, trimming, cancel keys     (run/job_lease.py, run/consumer_lease.py,
                                                             recover/takeover_claim.py, intake/stream_trim.py)
        the rounds on the I/O threads, one write per Redis server (run/node_rounds.py)  ||  engine.step()
            (the engine never waits on Redis, except for a round that counts an attempt: that one is
            answered before the step that runs the job)
        per lane: each reply to whoever sent its command (job_path.decide on a job's lookups), then the
        lane's deltas of the step turned into its events

A single stream is one lane; shards on one Redis, cluster shards, per-model streams, priority and tenant
lanes are lane layouts with a read policy (intake/lanes.py, intake/read_policy.py), built from the
config by run/build.py. A job's path from XREADGROUP to XACK: intake/stream_reader.py, job_path.py,
publish/publisher.py.

Idle on every lane, the loop blocks in XREADGROUP: one over every lane's stream when they share one Redis
(intake/joint_wait.py), else on each lane in turn for block_ms / lanes (at least ~100 ms each on Redis
7.0 at its default hz 10: a short BLOCK is answered at the server's next cron tick). While any lane has
work (a step, jobs in flight or being admitted, commands owed, or a backlog to read) every lane does a
non-blocking round per tick. Redis unreachable or full: a lane's round is sent again with back-off until
it goes through (connection.py), nothing is admitted meanwhile, and a stop request still ends the loop
within the drain timeout (run/stop.py).

The read policy may change at run time: `policy` is read once per tick, `use_policy` swaps it, and
callables in `between_ticks` run on the loop's thread before each tick. A lane's Redis may change under
it (a cluster shard's master failing over: `LaneServers`); the lane then forgets its jobs (aborted in
the engine, nothing written) and starts over from the server's state, as a worker restarted under the
same name would (`restart_lane`).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Sequence
from concurrent import futures as cf
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import redis
import structlog

from engine.client import EngineClient
from engine.outputs import StepDelta
from worker.config import WorkerConfig
from worker.intake.fair_share import served_tokens
from worker.intake.joint_wait import wait_on_lanes
from worker.intake.lanes import Lane, single_stream
from worker.intake.read_policy import OneLane, ReadPolicy
from worker.run.engine_room import engine_room
from worker.run.hooks import NO_HOOKS, Hooks
from worker.run.lane_run import LaneRun, LaneServers, Step
from worker.run.metrics import Metrics
from worker.run.node_rounds import NodeRounds
from worker.run.observer import Observer
from worker.run.stop import StopFlag, StopRequested

log = structlog.get_logger("conveyor.worker")


@dataclass
class Layout:
    """The lanes a worker reads, the client holding each (the same client for every lane on one Redis),
    how their servers may change, and the read policy over them (one policy lane per lane)."""

    lanes: list[Lane]
    clients: list[redis.Redis]
    policy: ReadPolicy
    servers: LaneServers = field(default_factory=LaneServers)


class Worker:
    def __init__(
        self,
        engine: EngineClient,
        client: redis.Redis,
        cfg: WorkerConfig,
        observer: Observer | None = None,
        hooks: Hooks = NO_HOOKS,
        layout: Layout | None = None,
    ) -> None:
        """`client`: the worker's Redis; without a `layout`, the worker reads one lane, cfg.keys.requests
        through cfg.group on `client` (run/build.py builds the other layouts)."""
        layout = layout or Layout(single_stream(cfg.keys, cfg.group), [client], OneLane())
        if (
            len(layout.clients) != len(layout.lanes)
            or layout.policy.lanes != len(layout.lanes)
            or not layout.lanes
        ):
            raise ValueError(
                f"{len(layout.lanes)} lanes need as many clients and a policy over as many lanes"
            )
        self.engine, self.cfg, self.hooks = engine, cfg, hooks
        self.observer = observer or Observer(Metrics({"consumer": cfg.consumer}))
        self.stop = StopFlag(cfg.drain_timeout_s)
        self.policy, self.servers = layout.policy, layout.servers
        self.between_ticks: list[Callable[[], None]] = []
        # An idle tick's joint wait blocks at most this long: a hook in between_ticks that must run every
        # so often even while idle (HomeWatch) lowers it to its interval.
        self.idle_block_ms = cfg.block_ms
        self._lane_block_ms = max(1, cfg.block_ms // len(layout.lanes))  # each lane's wait, in turn
        self.lanes: list[LaneRun] = []
        for lane, lane_client in zip(layout.lanes, layout.clients, strict=True):
            self.lanes.append(self._lane(lane, lane_client))
        _share_consumer_leases(self.lanes)
        self.nodes = NodeRounds()
        self.io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="conveyor-io")  # the last writes
        self._next = 0  # the lane built first in the next tick
        self._started = False
        # Lanes restarted from their server's state, with their jobs still in the engine (samples not
        # ended): their pending entries are read again once those have left it (an id runs once there).
        self._leaving: dict[int, dict[str, int]] = {}
        self.refused: str | None = None  # Redis refused a command for lack of permission (ACL): why

    @property
    def metrics(self) -> Metrics:
        return self.observer.metrics

    def _lane(self, lane: Lane, client: redis.Redis) -> LaneRun:
        lane_cfg = replace(self.cfg, keys=lane.keys, group=lane.group, block_ms=self._lane_block_ms)
        return LaneRun(self.engine, client, lane_cfg, self.observer, self.stop, self.hooks)

    def add_lane(self, lane: Lane, client: redis.Redis) -> LaneRun:
        """Read one more lane from now on (a tenant first seen: run/tenant_watch.py), on the loop's thread
        (`between_ticks`) of a running worker, after the policy's own `add_lane`. It starts as the others
        did: its group made (from the stream's first entry), its own pending entries resumed."""
        if self.policy.lanes != len(self.lanes) + 1:
            raise ValueError("add the lane to the read policy first")
        run = self._lane(lane, client)
        self.lanes.append(run)
        _share_consumer_leases(self.lanes)  # one consumer name, one lease token
        run.start()
        return run

    def use_policy(self, policy: ReadPolicy) -> None:
        """Read with `policy` from the next tick on (call it on the loop's thread: `between_ticks`)."""
        if policy.lanes != len(self.lanes):
            raise ValueError(f"the policy has {policy.lanes} lanes, the worker {len(self.lanes)}")
        self.policy = policy

    # ---- the loop -------------------------------------------------------------------------------------
    def run(self) -> None:
        redis_lost = False
        try:
            self.start()
            drain_logged = False
            while not self.stop.cold.is_set():
                if self.stop.warm.is_set():
                    if not drain_logged:
                        drain_logged = True
                        log.info(
                            "draining: no new jobs",
                            in_flight=self.in_flight(),
                            timeout_s=self.cfg.drain_timeout_s,
                        )
                    if not self.in_flight() or self.stop.expired():
                        break
                self.tick()
        except StopRequested as exc:
            redis_lost = True
            log.warning("stopping while Redis is unavailable or full", error=str(exc))
        except redis.exceptions.NoPermissionError as exc:
            # Waiting will not help and every later round would be refused too: stop writing, exit.
            redis_lost, self.refused = True, str(exc)
            log.error(
                "redis refused a command (ACL): grant the worker's commands, docs/operations.md Security",
                error=str(exc),
            )
        finally:
            self.shutdown(redis_lost)

    def start(self) -> None:
        # The model and tokenizer are millions of long-lived objects: a full collection walking them
        # stalled the loop for ~200 ms mid-generation. Freezing moves them out of the collector's view.
        gc.collect()
        gc.freeze()
        self._started = True
        for lane in self.lanes:
            lane.start()
        self.observer.started()
        log.info(
            "worker started", lanes=len(self.lanes), first=self.lanes[0].stream, consumer=self.cfg.consumer
        )

    def tick(self) -> None:
        """One pass of the loop: every lane's round built, sent with one write per server while the engine
        steps, then each lane's replies and deltas; or an idle wait. Tests drive workers with it."""
        for hook in self.between_ticks:
            hook()
        policy = self.policy
        n = len(self.lanes)
        capacity = engine_room(self.engine, self.engine.stats())  # once a tick: stats() is not free
        room = self.room_left(capacity)
        wait = not self._has_work(room, policy)
        if wait and not self.stop.warm.is_set() and n > 1 and self._wait_together(room, policy):
            # The same lane leads the next tick: only the lane leading a tick has room left to claim
            # lapsed leases in (LaneRun.build), so every lane must lead in turn.
            for k, lane in enumerate(self.lanes):
                if lane.arrived:
                    policy.idle_read(k, len(lane.arrived))
            return
        order = [(self._next + i) % n for i in range(n)]
        self._next = (self._next + 1) % n
        shares = policy.shares(room, first=order[0])
        begun: list[tuple[int, Step]] = []
        for k in order:
            lane = self.lanes[k]
            if k in self._leaving:
                continue
            try:
                if wait:  # idle on every lane: block on this one (its wait finding jobs ends the others')
                    if self.engine.has_unfinished_requests() or lane.has_work():
                        wait = False
                    else:
                        lane.wait(_capped(self.room_left(capacity), policy.idle_cap(k)))
                        wait = not lane.has_work()
                        if lane.arrived:
                            policy.idle_read(k, len(lane.arrived))
                        continue
                step = lane.build(self.room_left(capacity), shares[k])
            except self.servers.moved_errors as moved:  # while waiting idle
                self.restart_lane(k, moved)
                continue
            if self.servers.moved(lane.client):  # nothing goes to the new server before the lane forgot
                self.restart_lane(k, RuntimeError(f"lane {k}'s server moved"))  # its jobs
                continue
            begun.append((k, step))
        futures = self.nodes.send([(self.lanes[k].client, step.rnd) for k, step in begun])
        # Rounds that count an attempt are answered before the step that runs the job (job_path.py).
        cf.wait(
            [f for (_, step), f in zip(begun, futures, strict=True) if f is not None and step.rnd.before_step]
        )
        busy = (
            any(step.busy for _, step in begun) or bool(self._leaving)
        ) and self.engine.has_unfinished_requests()
        sampled_at = self._step(busy)
        new_tokens = 0
        for (k, step), future in zip(begun, futures, strict=True):
            try:
                deltas = self.lanes[k].finish(step, future, sampled_at)
            except self.servers.moved_errors as moved:
                self.restart_lane(k, moved)
                continue
            new_tokens += sum(len(d.new_token_ids) for d in deltas)
            if step.reads:
                policy.read_back(k, step.reads, len(self.lanes[k].arrived))
            policy.charge(k, served_tokens(deltas))
        for k in list(self._leaving):
            self._resume_when_left(k)
        if begun:
            self.observer.stepped(new_tokens, self.engine, busy)

    def _step(self, busy: bool) -> float:
        """One engine step (when `busy`), its deltas put in their lanes' buckets, its wall time shared out
        over every lane's jobs in it. Returns time.perf_counter() when the deltas were sampled."""
        began = time.perf_counter()
        deltas = self.engine.step() if busy else []
        at = time.perf_counter()
        if busy:
            self.observer.engine_stepped(at - began)
            tokens = self.engine.step_tokens()
            for lane in self.lanes:
                lane.credit(at - began, tokens)
        self.hooks.stepped(deltas, time.time())
        self._route(deltas)
        return at

    def _route(self, deltas: list[StepDelta]) -> None:
        """Each delta to the lane whose job it is; a job of no lane's (a restarted lane's, aborted) is
        nobody's to publish: its last samples ending let that lane read its entries again."""
        if len(self.lanes) == 1 and not self._leaving:
            self.lanes[0].bucket.extend(deltas)
            return
        for delta in deltas:
            lane = next((lane for lane in self.lanes if delta.request_id in lane.inflight), None)
            if lane is not None:
                lane.bucket.append(delta)
            elif delta.finished:
                for leaving in self._leaving.values():
                    if delta.request_id in leaving:
                        leaving[delta.request_id] -= 1
                        if leaving[delta.request_id] <= 0:
                            del leaving[delta.request_id]

    def room_left(self, capacity: int | None = None) -> int:
        """Jobs the engine can start now (`capacity`: free sequence slots, and KV blocks at the current
        per-job use; read from the engine when not given), less those on their way in through every lane."""
        if capacity is None:
            capacity = engine_room(self.engine, self.engine.stats())
        return max(0, capacity - sum(lane.reserved() for lane in self.lanes))

    def _has_work(self, room: int, policy: ReadPolicy) -> bool:
        """Whether any lane has a step or a round to do this tick, or a backlog to read (a hungry lane, and
        room). Then no lane blocks on its stream: reads go out in the tick's rounds, one write per
        server. Blocking in turn (a round trip each, ~100 ms each on an empty stream) is for a worker idle
        on every lane."""
        if self.engine.has_unfinished_requests() or any(lane.has_work() for lane in self.lanes):
            return True
        return len(self.lanes) > 1 and room > 0 and policy.backlog()

    def _wait_together(self, room: int, policy: ReadPolicy) -> bool:
        """Idle on every lane: one blocking read over all of them when they share one Redis
        (intake/joint_wait.py), each taking at most the policy's idle cap; False when they cannot be
        read together (then each blocks in turn)."""
        if self._leaving:
            return False
        readers = [lane.reader for lane in self.lanes]
        caps = [policy.idle_cap(k) for k in range(len(readers))]
        return wait_on_lanes(readers, [lane.arrived for lane in self.lanes], room, self.idle_block_ms, caps)

    def restart_lane(self, k: int, why: Exception) -> None:
        """Forget lane k's jobs (its server's state is the truth now) and accept its new server."""
        log.warning("lane's server changed: restarting its jobs from the new one", lane=k, error=str(why))
        self._leaving[k] = self.lanes[k].forget_jobs()
        self.servers.accept_move(self.lanes[k].client)
        self._resume_when_left(k)

    def _resume_when_left(self, k: int) -> None:
        if self._leaving[k]:  # their final "abort" deltas are still to come
            return
        del self._leaving[k]
        try:
            self.lanes[k].resume_pending()
        except self.servers.moved_errors as moved:  # moved again meanwhile
            self.restart_lane(k, moved)

    def in_flight(self) -> int:
        return sum(len(lane.inflight) for lane in self.lanes)

    # ---- shutdown -------------------------------------------------------------------------------------
    def shutdown(self, redis_lost: bool = False) -> None:
        """Each lane writes what is owed and releases its jobs left (unless Redis is lost: then nothing
        more is written). Safe on a worker that never started."""
        self.nodes.close()
        unacked = 0
        for lane in self.lanes:
            try:
                # A lane never started writes nothing; one whose Redis is lost writes nothing more.
                unacked += lane.shutdown(self.io, redis_lost or not lane.started)
            except self.servers.moved_errors:  # jobs left pending on the new server, for whoever reads
                log.warning("lane's server moved while stopping", stream=lane.stream)
        if self._started:
            gc.unfreeze()
        self.io.shutdown(wait=True)
        log.info("worker stopped", left_unacknowledged=unacked)


def _capped(room: int, cap: int | None) -> int:
    return room if cap is None else min(room, cap)


def _share_consumer_leases(lanes: Sequence[LaneRun]) -> None:
    """Lanes whose jobs share keys (intake/lanes.py's split_stream) share the consumer name's lease key:
    one token for all of them, so each lane holds it as this process's."""
    by_key: dict[str, LaneRun] = {}
    for lane in lanes:
        first = by_key.setdefault(lane.consumer_lease.key, lane)
        lane.consumer_lease.token = first.consumer_lease.token

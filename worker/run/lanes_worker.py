"""A worker over several lanes (intake/lanes.py): one `Worker` per lane over one engine, ticked in turn.

Each lane's Worker is the single-stream worker unchanged, with the lane's keys and group, and a client on
the Redis holding the lane (one Redis: the same client for every lane; a cluster: the shard's master,
worker/cluster/sharded_worker.py): its consumer group, leases, XAUTOCLAIM takeover, dead letters,
trimming and cancel channel are per lane. The engine is shared through views (shared_engine.py).

A cycle drives the lanes' workers through a tick's parts (Worker.begin, step_engine, finish) in a
rotating order; the read policy (intake/read_policy.py) splits the engine's room between the lanes, and
is told after the replies what each read found (`read_back`) and what service each lane's jobs got
(`charge`, in tokens: intake/fair_share.py's `served_tokens`). The rounds built in a cycle go out with one write per Redis server (node_rounds.py): on one
Redis, one write a cycle whatever the number of lanes. While any lane has work (a step, jobs in flight
or being admitted, commands owed, or a backlog to read) every lane's worker does a non-blocking round
per cycle; only a worker idle on every lane blocks: on one Redis, in one XREADGROUP over every lane's
stream (intake/joint_wait.py); in a cluster, on each lane's stream in turn for block_ms / lanes (at least
~100 ms each on Redis 7.0 at its default hz 10: a short BLOCK is answered at the server's next cron
tick), so an idle cycle there takes about max(block_ms, lanes x 100 ms).

The policy may change at run time: `policy` is a plain attribute read once per cycle, `use_policy`
swaps it, and callables given to `between_ticks` run on the loop's thread before each cycle, where
another component (a registry that moves home shards) may call the policy's methods.

A lane's Redis may change under it (a cluster shard's master failing over): `LaneServers` says how to
notice it. The lane's worker then forgets its jobs (aborted in the engine, nothing written) and starts
over from the server's state, as a worker restarted under the same name would (`restart_lane`).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from concurrent import futures as cf
from dataclasses import replace

import redis
import structlog

from engine.client import EngineClient
from worker.config import WorkerConfig
from worker.intake.fair_share import served_tokens
from worker.intake.joint_wait import wait_on_lanes
from worker.intake.lanes import Lane, cluster_shards
from worker.intake.read_policy import ReadPolicy
from worker.intake.read_shares import ReadShares
from worker.run.hooks import NO_HOOKS, Hooks
from worker.run.loop import Step, Worker
from worker.run.metrics import Metrics
from worker.run.node_rounds import NodeRounds
from worker.run.observer import Observer
from worker.run.shared_engine import SharedEngine
from worker.run.stop import StopFlag, StopRequested

log = structlog.get_logger("conveyor.worker")


class LaneServers:
    """How a lane's Redis can change under the worker. On one Redis it cannot: this base notices nothing.
    A cluster's shard fails over (worker/cluster/sharded_worker.py's ClusterFailover)."""

    # Raised by a lane's Redis calls when its server changed: the lane restarts from the new state.
    moved_errors: tuple[type[Exception], ...] = ()

    def moved(self, client: redis.Redis) -> bool:
        """Whether the lane's server changed since the last `accept_move` (checked before a round goes)."""
        return False

    def accept_move(self, client: redis.Redis) -> None:
        """Send the lane's commands to its new server from now on."""


def shares_policy(cfg: WorkerConfig, lanes: int) -> ReadShares:
    """Shards' default policy: workers start their turns at different shards, so they drain different
    backlogs (intake/read_shares.py)."""
    return ReadShares(lanes, turn=zlib.crc32(cfg.consumer.encode()) % lanes)


class LanesWorker:
    def __init__(
        self,
        engine: EngineClient,
        lanes: Sequence[Lane],
        clients: Sequence[redis.Redis],
        cfg: WorkerConfig,
        policy: ReadPolicy,
        observer: Observer | None = None,
        servers: LaneServers | None = None,
        hooks: Hooks = NO_HOOKS,
    ) -> None:
        """`clients[k]` holds lane k (the same client for every lane on one Redis); `policy` has one lane
        per lane. `cfg` is the worker's; each lane's Worker gets it with the lane's keys and group."""
        if len(clients) != len(lanes) or policy.lanes != len(lanes) or not lanes:
            raise ValueError(f"{len(lanes)} lanes need as many clients and a policy over as many lanes")
        self.cfg = cfg
        self.lanes = list(lanes)
        self.shared = SharedEngine(engine, len(lanes))
        self.stop = StopFlag(cfg.drain_timeout_s)
        self.observer = observer or Observer(Metrics({"consumer": cfg.consumer}))
        self.servers = servers or LaneServers()
        self.hooks = hooks
        self.policy = policy
        self.between_ticks: list[Callable[[], None]] = []
        # An idle cycle's joint wait (below) blocks at most this long: a hook in between_ticks that must
        # run every so often even while idle (HomeWatch) lowers it to its interval.
        self.idle_block_ms = cfg.block_ms
        self.workers: list[Worker] = []
        for k, (lane, client) in enumerate(zip(lanes, clients, strict=True)):
            self.workers.append(self._lane_worker(self.shared.views[k], lane, client))
        _share_consumer_leases(self.workers)
        self.shared.reserved = lambda k: self.workers[k].reserved()
        self.nodes = NodeRounds()
        self._next = 0  # the lane ticked first in the next cycle
        self._started: list[Worker] = []  # lanes' workers started (run, add_lane): they write at shutdown
        # Lanes restarted from their server's state, with the ids of the jobs they aborted: their pending
        # entries are read again once those jobs have left the engine (an id runs at most once there).
        self._leaving: dict[int, set[str]] = {}

    @property
    def metrics(self) -> Metrics:
        return self.observer.metrics

    def _lane_worker(self, view, lane: Lane, client: redis.Redis) -> Worker:
        per_lane_block = max(1, self.cfg.block_ms // len(self.lanes))
        lane_cfg = replace(self.cfg, keys=lane.keys, group=lane.group, block_ms=per_lane_block)
        worker = Worker(view, client, lane_cfg, self.observer, self.stop, self.hooks)
        worker.accounts_steps = False  # the shared step is timed once, in tick()
        return worker

    def add_lane(self, lane: Lane, client: redis.Redis) -> Worker:
        """Read one more lane from now on (a tenant first seen: run/tenant_watch.py), on the loop's thread
        (`between_ticks`) of a running worker, after the policy's own `add_lane`. Its worker starts as the
        others did: its group made (from the stream's first entry), its own pending entries resumed."""
        if self.policy.lanes != len(self.lanes) + 1:
            raise ValueError("add the lane to the read policy first")
        self.lanes.append(lane)
        worker = self._lane_worker(self.shared.add_view(), lane, client)
        self.workers.append(worker)
        _share_consumer_leases(self.workers)  # one consumer name, one lease token
        self._started.append(worker)
        worker.start()
        return worker

    def use_policy(self, policy: ReadPolicy) -> None:
        """Read with `policy` from the next cycle on (call it on the loop's thread: `between_ticks`)."""
        if policy.lanes != len(self.lanes):
            raise ValueError(f"the policy has {policy.lanes} lanes, the worker {len(self.lanes)}")
        self.policy = policy

    def run(self) -> None:
        started = self._started
        redis_lost = False
        try:
            for worker in self.workers:
                started.append(worker)
                worker.start()
            log.info(
                "lanes worker started",
                lanes=len(self.lanes),
                first=self.lanes[0].stream,
                consumer=self.cfg.consumer,
            )
            while not self.stop.cold.is_set():
                if self.stop.warm.is_set() and (not self.inflight() or self.stop.expired()):
                    break
                self.tick()
        except StopRequested as exc:
            log.warning("stopping while Redis is unavailable or full", error=str(exc))
            redis_lost = True
        finally:
            self.nodes.close()
            for worker in self.workers:
                try:
                    # A worker never started writes nothing; one whose Redis is lost writes nothing more.
                    worker.shutdown(redis_lost=redis_lost or worker not in started)
                except self.servers.moved_errors:  # jobs left pending on the new server, for whoever reads
                    log.warning("lane's server moved while stopping", stream=worker.cfg.keys.requests)

    def tick(self) -> None:
        """One cycle: every lane's round built, sent with one write per server, at most one engine step,
        then each lane's replies and events handled."""
        for hook in self.between_ticks:
            hook()
        policy = self.policy
        self.shared.new_cycle()
        n = len(self.workers)
        room = self.workers[self._next].room()
        wait = not self._has_work(room, policy)
        if wait and not self.stop.warm.is_set() and self._wait_together(room, policy):
            # The same lane leads the next cycle: only the lane leading a cycle has room left to claim
            # lapsed leases in (Worker._build_round), so every lane must lead in turn.
            for k, worker in enumerate(self.workers):
                if worker.arrived:
                    policy.idle_read(k, len(worker.arrived))
            return
        order = [(self._next + i) % n for i in range(n)]
        self._next = (self._next + 1) % n
        shares = policy.shares(room, first=order[0])
        begun: list[tuple[int, Step]] = []
        for k in order:
            if k in self._leaving:
                self._resume_when_left(k)
                if k in self._leaving:
                    continue
            try:
                step = self.workers[k].begin(max_reads=shares[k], wait=wait, max_waited=policy.idle_cap(k))
            except self.servers.moved_errors as moved:  # while waiting idle
                self.restart_lane(k, moved)
                continue
            wait = wait and not self.workers[k].has_work()  # its wait found jobs: the others must not wait
            if step is None:
                if self.workers[k].arrived:  # an idle wait on this lane found jobs
                    policy.idle_read(k, len(self.workers[k].arrived))
                continue
            if self.servers.moved(self.workers[k].client):  # nothing goes to the new server before the
                self.restart_lane(k, RuntimeError(f"lane {k}'s server moved"))  # lane forgot its jobs
                continue
            begun.append((k, step))
        futures = self.nodes.send([(self.workers[k].client, step.rnd) for k, step in begun])
        # Rounds that count an attempt are answered before the step that runs the job (job_path.py).
        cf.wait(
            [f for (_, step), f in zip(begun, futures, strict=True) if f is not None and step.rnd.before_step]
        )
        stepped = [self.workers[k].step_engine(step) for k, step in begun]
        if self.shared.step_s:  # the step's wall time shared out over every lane's jobs in it
            self.observer.engine_stepped(self.shared.step_s)
            tokens = self.shared.engine.step_tokens()
            for worker in self.workers:
                worker.credit(self.shared.step_s, tokens)
        for (k, step), future, done in zip(begun, futures, stepped, strict=True):
            try:
                self.workers[k].finish(step, future, done)
            except self.servers.moved_errors as moved:
                self.restart_lane(k, moved)
                continue
            if step.reads:
                policy.read_back(k, step.reads, len(self.workers[k].arrived))
            policy.charge(k, served_tokens(done.deltas))

    def _has_work(self, room: int, policy: ReadPolicy) -> bool:
        """Whether any lane has a step or a round to do this cycle, or a backlog to read (a hungry lane,
        and room). Then no lane blocks on its stream: reads go out in the cycle's rounds, one write per
        server. Blocking in turn (a round trip each, ~100 ms each on an empty stream) is for a worker idle
        on every lane; before, idle lanes blocked in turn while another lane's jobs were admitted."""
        if self.shared.engine.has_unfinished_requests() or any(w.has_work() for w in self.workers):
            return True
        return room > 0 and policy.backlog()

    def _wait_together(self, room: int, policy: ReadPolicy) -> bool:
        """Idle on every lane: one blocking read over all of them when they share one Redis
        (intake/joint_wait.py), each taking at most the policy's idle cap; False when they cannot be
        read together (then each blocks in turn)."""
        if self._leaving:
            return False
        readers = [w.reader for w in self.workers]
        caps = [policy.idle_cap(k) for k in range(len(readers))]
        return wait_on_lanes(readers, [w.arrived for w in self.workers], room, self.idle_block_ms, caps)

    def restart_lane(self, k: int, why: Exception) -> None:
        """Forget lane k's jobs (its server's state is the truth now) and accept its new server."""
        log.warning("lane's server changed: restarting its jobs from the new one", lane=k, error=str(why))
        leaving = self.workers[k].forget_jobs()
        self.servers.accept_move(self.workers[k].client)
        self._leaving[k] = leaving
        self._resume_when_left(k)

    def _resume_when_left(self, k: int) -> None:
        if any(job_id in self.shared.shard_of for job_id in self._leaving[k]):
            self.shared.step_for(k)  # their final "abort" deltas; nobody publishes them (not in flight)
            return
        # Their last deltas may wait in the lane's bucket (another view stepped): they must not reach the
        # same ids admitted again.
        leaving = self._leaving.pop(k)
        self.shared.buckets[k] = [d for d in self.shared.buckets[k] if d.request_id not in leaving]
        try:
            self.workers[k].resume_pending()
        except self.servers.moved_errors as moved:  # moved again meanwhile
            self.restart_lane(k, moved)

    def inflight(self) -> int:
        return sum(len(w.inflight) for w in self.workers)


def _share_consumer_leases(workers: list[Worker]) -> None:
    """Lanes whose jobs share keys (intake/lanes.py's split_stream) share the consumer name's lease key:
    one token for all of them, so each lane's worker holds it as this process's."""
    by_key: dict[str, Worker] = {}
    for worker in workers:
        first = by_key.setdefault(worker.consumer_lease.key, worker)
        worker.consumer_lease.token = first.consumer_lease.token


def shards_on_one_redis(
    engine: EngineClient,
    client: redis.Redis,
    cfg: WorkerConfig,
    observer: Observer | None = None,
    hooks: Hooks = NO_HOOKS,
) -> LanesWorker:
    """Protocol version 2's layout on one Redis (`conveyor worker --shards S` without --cluster): a lane
    per shard, all through `client`, read with the shards' policy."""
    shards = cfg.shard_count
    if shards is None:
        raise ValueError("a sharded layout needs cfg.shards")
    lanes = cluster_shards(cfg.keys.prefix, shards, cfg.group)
    policy = shares_policy(cfg, shards)
    return LanesWorker(engine, lanes, [client] * shards, cfg, policy, observer, hooks=hooks)

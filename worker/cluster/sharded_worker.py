"""A worker in cluster mode: one `Worker` per shard over one engine (shared_engine.py), ticked in turn.

Each shard's Worker is the single-Redis worker unchanged, with its shard's keys (protocol version 2) and a
client on the master holding the shard's slot (connect.py): its consumer group, leases, XAUTOCLAIM
takeover, dead letters, trimming and cancel channel are per shard, and every MULTI/EXEC and script stays
in one slot. A cycle drives the shards' workers through a tick's parts (Worker.begin, step_engine,
finish) in a rotating order, so the shard read first (when the engine has room for fewer jobs than are
queued) changes every cycle and no shard starves; the rounds they built go out with one write per Redis
node (node_rounds.py), not one per shard. New jobs are read one shard at a time (read_shares.py), so
a step's events go out in a few script calls, not one per shard. While any shard has work (a step, jobs
in flight or being admitted, commands owed, or a backlog to read) every shard's worker does a
non-blocking round per cycle; only a worker idle on every shard blocks, each shard on its own stream in
turn for block_ms / shards (at least ~100 ms each on Redis 7.0 at its default hz 10: a short BLOCK is
answered at the server's next cron tick), so an idle cycle takes about max(block_ms, shards x 100 ms).

When a shard's master fails and a replica takes over, the writes this worker made last (events, acks) may
not have reached the replica. The shard's worker then forgets its jobs (aborted in the engine, nothing
written) and starts over from the new master's state, as a worker restarted under the same name would:
its pending entries are read again and resumed from the events their output streams hold
(recover/resume_point.py).
"""

from __future__ import annotations

import zlib
from concurrent import futures as cf
from dataclasses import replace

import structlog
from redis.cluster import RedisCluster

from engine.client import EngineClient
from worker.cluster.connect import MasterPool, ShardMoved, shard_client
from worker.cluster.node_rounds import NodeRounds
from worker.cluster.read_shares import ReadShares
from worker.cluster.shard_keys import ShardedKeys
from worker.cluster.shared_engine import SharedEngine
from worker.config import WorkerConfig
from worker.intake.lanes import cluster_shards
from worker.intake.read_policy import ReadPolicy
from worker.run.loop import Step, Worker
from worker.run.metrics import Metrics
from worker.run.observer import Observer
from worker.run.stop import StopFlag, StopRequested

log = structlog.get_logger("conveyor.worker")


class ShardedWorker:
    def __init__(
        self,
        engine: EngineClient,
        cluster: RedisCluster,
        cfg: WorkerConfig,
        observer: Observer | None = None,
    ) -> None:
        self.cfg = cfg
        self.sharded = ShardedKeys(cfg.keys.prefix, cfg.shards)
        self.shared = SharedEngine(engine, cfg.shards)
        self.stop = StopFlag(cfg.drain_timeout_s)
        self.observer = observer or Observer(Metrics({"consumer": cfg.consumer}))
        per_shard_block = max(1, cfg.block_ms // cfg.shards)
        self.workers: list[Worker] = []
        # A lane per shard (intake/lanes.py), each read by its own Worker.
        for k, lane in enumerate(cluster_shards(cfg.keys.prefix, cfg.shards, cfg.group)):
            shard_cfg = replace(cfg, keys=lane.keys, cluster=True, block_ms=per_shard_block)
            client = shard_client(cluster, lane.stream, fence_moves=True)
            self.workers.append(Worker(self.shared.views[k], client, shard_cfg, self.observer, self.stop))
            self.workers[-1].accounts_steps = False  # the shared step is timed once, in tick()
        self.shared.reserved = lambda k: self.workers[k].reserved()
        self.nodes = NodeRounds()
        self._next = 0  # the shard ticked first in the next cycle
        # Workers start their turns at different shards (read_shares.py), so they drain different backlogs.
        self.reads: ReadPolicy = ReadShares(cfg.shards, turn=zlib.crc32(cfg.consumer.encode()) % cfg.shards)
        # Shards rebuilt after a failover, with the ids of the jobs they aborted: their pending entries are
        # read again once those jobs have left the engine (an id runs at most once there).
        self._leaving: dict[int, set[str]] = {}

    @property
    def metrics(self) -> Metrics:
        return self.observer.metrics

    def run(self) -> None:
        started: list[Worker] = []
        redis_lost = False
        try:
            for worker in self.workers:
                started.append(worker)
                worker.start()
            log.info("sharded worker started", shards=self.cfg.shards, consumer=self.cfg.consumer)
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
                except ShardMoved:  # jobs left pending on the new master, for whoever reads them
                    log.warning("shard moved while stopping", stream=worker.cfg.keys.requests)

    def tick(self) -> None:
        """One cycle: every shard's round built, sent with one write per node, at most one engine step,
        then each shard's replies and events handled."""
        self.shared.new_cycle()
        n = len(self.workers)
        order = [(self._next + i) % n for i in range(n)]
        self._next = (self._next + 1) % n
        room = self.workers[order[0]].room()
        shares = self.reads.shares(room, first=order[0])
        wait = not self._has_work(room)
        begun: list[tuple[int, Step]] = []
        for k in order:
            if k in self._leaving:
                self._resume_when_left(k)
                if k in self._leaving:
                    continue
            try:
                step = self.workers[k].begin(max_reads=shares[k], wait=wait)
            except ShardMoved as moved:  # while waiting idle
                self._rebuild(k, moved)
                continue
            wait = wait and not self.workers[k].has_work()  # its wait found jobs: the others must not wait
            if step is None:
                continue
            if self._pool(k).moved:  # nothing goes to the new master before the shard forgot its jobs
                self._rebuild(k, ShardMoved(f"shard {k}'s slot moved"))
                continue
            begun.append((k, step))
        futures = self.nodes.send([(self.workers[k].client, step.rnd) for k, step in begun])
        # Rounds that count an attempt are answered before the step that runs the job (job_path.py).
        cf.wait(
            [f for (_, step), f in zip(begun, futures, strict=True) if f is not None and step.rnd.before_step]
        )
        stepped = [self.workers[k].step_engine(step) for k, step in begun]
        if self.shared.step_s:  # the step's wall time shared out over every shard's jobs in it
            self.observer.engine_stepped(self.shared.step_s)
            tokens = self.shared.engine.step_tokens()
            for worker in self.workers:
                worker.credit(self.shared.step_s, tokens)
        for (k, step), future, done in zip(begun, futures, stepped, strict=True):
            try:
                self.workers[k].finish(step, future, done)
            except ShardMoved as moved:
                self._rebuild(k, moved)
                continue
            if step.reads:
                self.reads.read_back(k, step.reads, len(self.workers[k].arrived))
            self.reads.charge(k, sum(len(d.new_token_ids) for d in done.deltas))

    def _has_work(self, room: int) -> bool:
        """Whether any shard has a step or a round to do this cycle, or a backlog to read (a hungry shard,
        and room). Then no shard blocks on its stream: reads go out in the cycle's rounds, one write per
        master. Blocking in turn (a round trip each, ~100 ms each on an empty stream) is for a worker idle
        on every shard; before, idle shards blocked in turn while another shard's jobs were admitted."""
        if self.shared.engine.has_unfinished_requests() or any(w.has_work() for w in self.workers):
            return True
        return room > 0 and any(self.reads.hungry)

    def _pool(self, k: int) -> MasterPool:
        pool = self.workers[k].client.connection_pool
        assert isinstance(pool, MasterPool)
        return pool

    def _rebuild(self, k: int, moved: ShardMoved) -> None:
        """Forget shard k's jobs (the new master's state is the truth now) and accept the new master."""
        log.warning("shard failed over: restarting its jobs from the new master", shard=k, error=str(moved))
        leaving = self.workers[k].forget_jobs()
        self._pool(k).accept_move()
        self._leaving[k] = leaving
        self._resume_when_left(k)

    def _resume_when_left(self, k: int) -> None:
        if any(job_id in self.shared.shard_of for job_id in self._leaving[k]):
            self.shared.step_for(k)  # their final "abort" deltas; nobody publishes them (not in flight)
            return
        # Their last deltas may wait in the shard's bucket (another view stepped): they must not reach the
        # same ids admitted again.
        leaving = self._leaving.pop(k)
        self.shared.buckets[k] = [d for d in self.shared.buckets[k] if d.request_id not in leaving]
        try:
            self.workers[k].resume_pending()
        except ShardMoved as moved:  # moved again meanwhile
            self._rebuild(k, moved)

    def inflight(self) -> int:
        return sum(len(w.inflight) for w in self.workers)

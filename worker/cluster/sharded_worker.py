"""A worker in cluster mode: one `Worker` per shard over one engine (shared_engine.py), ticked in turn.

Each shard's Worker is the single-Redis worker unchanged, with its shard's keys (protocol version 2) and a
client on the master holding the shard's slot (connect.py): its consumer group, leases, XAUTOCLAIM
takeover, dead letters, trimming and cancel channel are per shard, and every MULTI/EXEC and script stays
in one slot. The loop ticks the shards' workers in a rotating order, so the shard read first (when the
engine has room for fewer jobs than are queued) changes every cycle and no shard starves. While the
engine has work each shard's worker does a non-blocking round per step; while it is idle each blocks on
its own stream for block_ms / shards, so the whole cycle waits about block_ms.
"""

from __future__ import annotations

from dataclasses import replace

import structlog
from redis.cluster import RedisCluster

from engine.client import EngineClient
from worker.cluster.connect import shard_client
from worker.cluster.shard_keys import ShardedKeys
from worker.cluster.shared_engine import SharedEngine
from worker.config import WorkerConfig
from worker.loop import Worker
from worker.metrics import Metrics
from worker.observer import Observer
from worker.stop import StopFlag, StopRequested

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
        for k, keys in enumerate(self.sharded.all()):
            shard_cfg = replace(cfg, keys=keys, cluster=True, block_ms=per_shard_block)
            client = shard_client(cluster, keys.requests)
            self.workers.append(Worker(self.shared.views[k], client, shard_cfg, self.observer, self.stop))
        self.shared.reserved = lambda k: self.workers[k]._admitting + len(self.workers[k].arrived)
        self._next = 0  # the shard ticked first in the next cycle

    def run(self) -> None:
        started: list[Worker] = []
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
            for worker in self.workers:
                worker._redis_lost = True
        finally:
            for worker in self.workers:
                if worker in started:
                    worker._shutdown()
                else:
                    worker.io.shutdown(wait=True)

    def tick(self) -> None:
        """One cycle: at most one engine step, and one tick of every shard's worker."""
        self.shared.new_cycle()
        n = len(self.workers)
        for i in range(n):
            self.workers[(self._next + i) % n].tick()
        self._next = (self._next + 1) % n

    def inflight(self) -> int:
        return sum(len(w.inflight) for w in self.workers)

"""A worker in cluster mode: the lanes worker (run/lanes_worker.py) over protocol version 2's shards, each
lane's client on the master holding its shard's slot, with the cluster's one hook: a shard's failover.

Each shard's keys sit in one hash slot (shard_keys.py), so every MULTI/EXEC and script of a lane stays in
one slot; the rounds of shards whose slots share a master go out in one write (run/node_rounds.py). New
jobs are read one shard at a time (intake/read_shares.py), so a step's events go out in a few script
calls, not one per shard.

When a shard's master fails and a replica takes over, the writes this worker made last (events, acks) may
not have reached the replica. The shard's client notices (the wire's MasterPool: `moved`, or
ShardMoved raised); the lanes worker then forgets that shard's jobs (aborted in the engine, nothing
written) and starts over from the new master's state, as a worker restarted under the same name would:
its pending entries are read again and resumed from the events their output streams hold
(recover/resume_point.py).
"""

from __future__ import annotations

from dataclasses import replace

import redis
from redis.cluster import RedisCluster

from engine.client import EngineClient
from worker.cluster.connect import shard_client
from worker.config import WorkerConfig
from worker.intake.lanes import cluster_shards
from worker.run.hooks import NO_HOOKS, Hooks
from worker.run.lanes_worker import LaneServers, LanesWorker, shares_policy
from worker.run.observer import Observer
from worker.wire.slot_following import MasterPool, ShardMoved


class ClusterFailover(LaneServers):
    moved_errors = (ShardMoved,)

    def moved(self, client: redis.Redis) -> bool:
        return _pool(client).moved

    def accept_move(self, client: redis.Redis) -> None:
        _pool(client).accept_move()


def _pool(client: redis.Redis) -> MasterPool:
    pool = client.connection_pool
    assert isinstance(pool, MasterPool)
    return pool


class ShardedWorker(LanesWorker):
    def __init__(
        self,
        engine: EngineClient,
        cluster: RedisCluster,
        cfg: WorkerConfig,
        observer: Observer | None = None,
        hooks: Hooks = NO_HOOKS,
    ) -> None:
        cfg = replace(cfg, cluster=True)  # sharded pub/sub (SPUBLISH, SSUBSCRIBE)
        shards = cfg.shard_count
        assert shards is not None  # (a cluster's default when not given)
        lanes = cluster_shards(cfg.keys.prefix, shards, cfg.group)
        clients = [shard_client(cluster, lane.stream, fence_moves=True) for lane in lanes]
        policy = shares_policy(cfg, len(lanes))
        super().__init__(engine, lanes, clients, cfg, policy, observer, ClusterFailover(), hooks)

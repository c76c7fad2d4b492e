"""From the config to a worker: its lanes, the Redis client holding each, and the read policy over them.

    one stream (protocol version 1)     one lane on the client                      OneLane
    --shards S, one Redis               a lane per shard, all on the client         ReadShares
    --cluster                           a lane per shard, each on its shard's       ReadShares, and a
                                        master (a shard's failover: ClusterFailover)  shard's failover
    --priority-lanes / --tenant-weight  a lane per level or tenant, on the client   PriorityLanes /
                                        (intake/lane_layout.py)                       FairShare

`--affinity` then swaps the shards' policy for HomeFirst (worker/fleet/home_watch.py). Every layout is
read by the one loop (run/loop.py).
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import replace

import redis
from redis.cluster import RedisCluster

from engine.client import EngineClient
from worker.cluster.connect import shard_client
from worker.config import WorkerConfig
from worker.connection import with_retry
from worker.intake.lane_layout import LaneLayout, read_policy, write_layout
from worker.intake.lanes import cluster_shards
from worker.intake.read_shares import ReadShares
from worker.run.hooks import NO_HOOKS, Hooks
from worker.run.lane_run import LaneServers
from worker.run.loop import Layout, Worker
from worker.run.observer import Observer
from worker.wire.slot_following import MasterPool, ShardMoved


def build(
    engine: EngineClient,
    client: redis.Redis | RedisCluster,
    cfg: WorkerConfig,
    lane_layout: LaneLayout | None = None,
    weights: Mapping[str, float] | None = None,
    observer: Observer | None = None,
    hooks: Hooks = NO_HOOKS,
) -> Worker:
    """The worker `cfg` (and a priority or tenant `lane_layout`, with its tenants' `weights`) asks for.
    `client` is the worker's Redis: a RedisCluster in cluster mode."""
    if isinstance(client, RedisCluster):  # a lane per shard, each on its shard's master
        cfg = replace(cfg, cluster=True)  # sharded pub/sub (SPUBLISH, SSUBSCRIBE)
        shards = cfg.shard_count
        assert shards is not None  # (a cluster's default when not given)
        lanes = cluster_shards(cfg.keys.prefix, shards, cfg.group)
        clients = [shard_client(client, lane.stream, fence_moves=True) for lane in lanes]
        layout = Layout(lanes, clients, shares_policy(cfg, shards), ClusterFailover())
        return Worker(engine, clients[0], cfg, observer, hooks, layout)
    if cfg.shard_count is not None:  # a lane per shard, all on this Redis
        lanes = cluster_shards(cfg.keys.prefix, cfg.shard_count, cfg.group)
        layout = Layout(lanes, [client] * len(lanes), shares_policy(cfg, len(lanes)))
        return Worker(engine, client, cfg, observer, hooks, layout)
    if lane_layout is None:  # one stream
        return Worker(engine, client, cfg, observer, hooks)
    # A lane per priority level or per tenant, all on this Redis.
    lanes = lane_layout.lanes(cfg.keys, cfg.group)
    layout = Layout(lanes, [client] * len(lanes), read_policy(lane_layout, weights or {}))
    worker = Worker(engine, client, cfg, observer, hooks, layout)
    if lane_layout.open:  # tenants first seen at run time get lanes of their own (run/tenant_watch.py)
        from worker.run.tenant_watch import TenantWatch

        watch = TenantWatch(
            worker, client, cfg, lane_layout, weights or {}, lambda: worker.observer.heartbeat
        )
        worker.between_ticks.append(watch)
    # Written for clients before the worker reads; waited out like every start-up write: a full (or
    # restarting) Redis holds the start, never ends it.
    with_retry(lambda: write_layout(client, cfg.keys, lane_layout), "writing the lane layout", worker.stop)
    return worker


def shares_policy(cfg: WorkerConfig, lanes: int) -> ReadShares:
    """Shards' default policy: workers start their turns at different shards, so they drain different
    backlogs (intake/read_shares.py)."""
    return ReadShares(lanes, turn=zlib.crc32(cfg.consumer.encode()) % lanes)


class ClusterFailover(LaneServers):
    """When a shard's master fails and a replica takes over, the writes this worker made last (events,
    acks) may not have reached the replica. The shard's client notices (the wire's MasterPool: `moved`, or
    ShardMoved raised); the loop then restarts that lane from the new master's state: its pending entries
    are read again and resumed from the events their output streams hold (recover/resume_point.py)."""

    moved_errors = (ShardMoved,)

    def moved(self, client: redis.Redis) -> bool:
        return _pool(client).moved

    def accept_move(self, client: redis.Redis) -> None:
        _pool(client).accept_move()


def _pool(client: redis.Redis) -> MasterPool:
    pool = client.connection_pool
    assert isinstance(pool, MasterPool)
    return pool

"""Connections in cluster mode: redis-py's cluster client (for clients and topology), and per shard a
plain client on the master that holds the shard's slot, which follows a failover to the new master (its
pool, MasterPool, lives with the rest of the worker's reach below redis-py's public API, worker/wire/).

A shard's keys all hash to one slot (shard_keys.py), so everything one shard's worker sends (a step's
MULTI/EXEC, its scripts, blocking reads) goes to one node, exactly as to a single Redis.
"""

from __future__ import annotations

import redis
from redis.cluster import RedisCluster

from worker.connection import TlsOptions
from worker.wire.slot_following import MasterPool


def connect_cluster(url: str, tls: TlsOptions | None = None, socket_timeout: float = 30.0) -> RedisCluster:
    """A cluster client returning bytes and speaking RESP2, like worker.connection.connect."""
    extra = tls.kwargs() if tls is not None and url.startswith("rediss://") else {}
    return RedisCluster.from_url(
        url,
        decode_responses=False,
        protocol=2,
        socket_timeout=socket_timeout,
        socket_connect_timeout=5.0,
        **extra,
    )


def shard_client(
    cluster: RedisCluster, key: str, socket_timeout: float = 30.0, fence_moves: bool = False
) -> redis.Redis:
    """A plain client (bytes, RESP2) on the master of `key`'s slot, following failovers."""
    # Credentials and TLS as the cluster client has them (from its URL); not its replica-reading hook.
    passed = (
        "username",
        "password",
        "connection_class",
        "ssl_ca_certs",
        "ssl_certfile",
        "ssl_keyfile",
        "ssl_cert_reqs",
    )
    given = cluster.nodes_manager.connection_kwargs
    pool = MasterPool(
        cluster,
        key,
        fence_moves,
        **{k: given[k] for k in passed if k in given and given[k] is not None},
        protocol=2,
        socket_timeout=socket_timeout,
        socket_connect_timeout=5.0,
        health_check_interval=15,
    )
    return redis.Redis(connection_pool=pool, decode_responses=False, protocol=2)

"""Connections in cluster mode: redis-py's cluster client (for clients and topology), and per shard a
plain client on the master that holds the shard's slot, which follows a failover to the new master.

A shard's keys all hash to one slot (shard_keys.py), so everything one shard's worker sends (a step's
MULTI/EXEC, its scripts, blocking reads) goes to one node, exactly as to a single Redis.
"""

from __future__ import annotations

import redis
import structlog
from redis.cluster import RedisCluster
from redis.exceptions import AskError, ClusterDownError, RedisClusterException, TryAgainError

from worker.connection import DOWN_ERRORS, TlsOptions

log = structlog.get_logger("conveyor.cluster")


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


class ShardMoved(RuntimeError):
    """The shard's slot has a new master: what this process wrote to the old one may not be there (writes
    not yet replicated are lost at a failover). Connections are refused until `accept_move()`, so that the
    shard's worker first drops what it holds in memory and rebuilds from what the new master has."""


# Replies saying the slot is not (only) here: MOVED (it moved: resharding, or a failover the client has
# not seen), ASK / TRYAGAIN (it is being migrated), CLUSTERDOWN (no master for some slot, e.g. mid-failover).
# The command did not run. MovedError is an AskError.
REDIRECTS = (AskError, TryAgainError, ClusterDownError)


class MasterPool(redis.ConnectionPool):
    """Connections to the master currently holding `key`'s slot. A connection that cannot be made, or a
    reply that redirects (REDIRECTS), asks the cluster for its slots again; when another node holds the
    slot now (a replica was promoted, the slot was resharded) the pool drops its connections and points
    there. A redirect reaches callers as a ConnectionError, so they retry with back-off
    (worker.connection.with_retry) as for a master that went away. With `fence_moves`, a move raises
    ShardMoved until accepted (the worker's pool; clients just follow)."""

    def __init__(self, cluster: RedisCluster, key: str, fence_moves: bool = False, **kwargs) -> None:
        self.cluster, self.key, self.fence_moves = cluster, key, fence_moves
        self.moved = False
        node = cluster.get_node_from_key(key)
        super().__init__(host=node.host, port=node.port, **kwargs)
        self.connection_class = _following(self.connection_class, self)

    def accept_move(self) -> None:
        self.moved = False

    def get_connection(self, *args, **kwargs):
        if self.moved:
            raise ShardMoved(
                f"{self.key}'s slot moved to {self.connection_kwargs['host']}:{self.connection_kwargs['port']}"
            )
        try:
            return super().get_connection(*args, **kwargs)
        except DOWN_ERRORS:
            self.follow()
            raise

    def follow(self) -> None:
        """Point at the slot's master as the cluster tells it now."""
        try:
            self.cluster.nodes_manager.initialize()
            node = self.cluster.get_node_from_key(self.key)
        except (*DOWN_ERRORS, RedisClusterException) as exc:
            log.warning("cluster topology unavailable", key=self.key, error=str(exc))
            return
        old = (self.connection_kwargs.get("host"), self.connection_kwargs.get("port"))
        if old != (node.host, node.port):
            log.info("shard moved to another master", key=self.key, old=f"{old[0]}:{old[1]}", new=node.name)
            self.connection_kwargs.update(host=node.host, port=node.port)
            self.disconnect()
            self.reset()
            self.moved = self.fence_moves


def _following(connection_class: type, pool: MasterPool) -> type:
    """`connection_class` whose replies that redirect make `pool` follow the slot (then raise as a lost
    connection: the connection's place in a MULTI is unknown now, so it is dropped)."""

    class Following(connection_class):
        def read_response(self, *args, **kwargs):
            try:
                return super().read_response(*args, **kwargs)
            except REDIRECTS as exc:
                log.warning("slot redirected", key=pool.key, reply=str(exc))
                self.disconnect()
                pool.follow()
                raise redis.ConnectionError(f"{pool.key}'s slot is elsewhere or moving: {exc}") from exc

    Following.__name__ = f"Following{connection_class.__name__}"
    return Following


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

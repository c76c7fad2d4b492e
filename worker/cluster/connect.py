"""Connections in cluster mode: redis-py's cluster client (for clients and topology), and per shard a
plain client on the master that holds the shard's slot, which follows a failover to the new master.

A shard's keys all hash to one slot (shard_keys.py), so everything one shard's worker sends (a step's
MULTI/EXEC, its scripts, blocking reads) goes to one node, exactly as to a single Redis.
"""

from __future__ import annotations

import redis
import structlog
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException

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


class MasterPool(redis.ConnectionPool):
    """Connections to the master currently holding `key`'s slot. A connection that cannot be made asks the
    cluster for its slots again; when another node holds the slot now (a replica was promoted) the pool
    drops its connections and connects there. Callers retry with back-off (worker.connection.with_retry)."""

    def __init__(self, cluster: RedisCluster, key: str, **kwargs) -> None:
        self.cluster, self.key = cluster, key
        node = cluster.get_node_from_key(key)
        super().__init__(host=node.host, port=node.port, **kwargs)

    def get_connection(self, *args, **kwargs):
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


def shard_client(cluster: RedisCluster, key: str, socket_timeout: float = 30.0) -> redis.Redis:
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
        **{k: given[k] for k in passed if k in given and given[k] is not None},
        protocol=2,
        socket_timeout=socket_timeout,
        socket_connect_timeout=5.0,
        health_check_interval=15,
    )
    return redis.Redis(connection_pool=pool, decode_responses=False, protocol=2)

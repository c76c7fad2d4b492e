"""A pool on whichever master holds one key's slot now: the shard client's pool in cluster mode
(worker/cluster/connect.py builds it). It follows a failover or a resharding by asking the cluster again
when a connection cannot be made or a reply redirects; redis-py has no public hook for either, so this
overrides a pool's `get_connection` and a connection's `read_response`."""

from __future__ import annotations

import redis
import structlog
from redis.cluster import RedisCluster
from redis.exceptions import AskError, ClusterDownError, RedisClusterException, TryAgainError

from worker.connection import DOWN_ERRORS

log = structlog.get_logger("conveyor.cluster")


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

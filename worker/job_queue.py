"""Where a client submits jobs and reads their events: one Redis with one stream (protocol version 1,
SingleQueue) or with version 2's shards (ShardedQueue), or the shards of a Redis Cluster (version 2,
worker/cluster/client.py's ClusterClient), behind one small interface so that `conveyor submit`,
`conveyor batch` and `conveyor demo` run unchanged on any of them.

`read_outputs` follows many jobs' output streams at once. On one Redis (sharded or not) that is one XREAD
over all of them; in a cluster the streams of different shards live on different nodes (a multi-key XREAD must stay in one
slot), so it reads every shard without blocking, and only when nothing came anywhere does it block, on
one shard at a time for a share of block_ms, so a quiet call still waits about block_ms.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import redis

from worker.client import enqueue, enqueue_sharded
from worker.cluster.shard_keys import ShardedKeys
from worker.keys import Keys


class JobQueue(Protocol):
    @property
    def shards(self) -> int: ...

    def submit(self, job: dict) -> int:
        """Queue the job; returns the shard whose output stream will hold its events."""
        ...

    def keys(self, shard: int) -> Keys: ...

    def node(self, shard: int) -> redis.Redis:
        """A client for the shard's keys (XREAD of its output streams)."""
        ...


class SingleQueue:
    """One Redis: a single shard, 0, named as protocol version 1 names it."""

    shards = 1

    def __init__(self, client: redis.Redis, keys: Keys | None = None) -> None:
        self.client, self._keys = client, keys or Keys()

    def submit(self, job: dict) -> int:
        enqueue(self.client, job, self._keys)
        return 0

    def keys(self, shard: int) -> Keys:
        return self._keys

    def node(self, shard: int) -> redis.Redis:
        return self.client


class ShardedQueue:
    """One Redis holding protocol version 2's shards (workers started with --shards and no --cluster)."""

    def __init__(self, client: redis.Redis, sharded: ShardedKeys) -> None:
        self.client, self.sharded = client, sharded

    @property
    def shards(self) -> int:
        return self.sharded.shards

    def submit(self, job: dict) -> int:
        return enqueue_sharded(self.client, job, self.sharded)

    def keys(self, shard: int) -> Keys:
        return self.sharded.shard(shard)

    def node(self, shard: int) -> redis.Redis:
        return self.client


@dataclass
class Cursor:
    """Where reading one job's output stream stands."""

    shard: int
    last_id: bytes = b"0"


def read_outputs(
    queue: JobQueue, cursors: dict[str, Cursor], block_ms: int, count: int = 256
) -> list[tuple[str, list[tuple[bytes, dict]]]]:
    """New entries of the streams named in `cursors` (output stream name -> Cursor): a list of
    (stream name, [(entry id, fields)]). Moves no cursor: the caller does, as it handles entries."""
    # Streams a client can read in one XREAD: every shard on one Redis, one shard's in a cluster.
    by_client: dict[int, tuple[redis.Redis, dict[str, bytes]]] = {}
    for name, cursor in cursors.items():
        client = queue.node(cursor.shard)
        by_client.setdefault(id(client), (client, {}))[1][name] = cursor.last_id
    if len(by_client) == 1:  # one read, blocking
        ((client, streams),) = by_client.values()
        return _read(client, streams, block_ms, count)
    found = [hit for client, streams in by_client.values() for hit in _read(client, streams, None, count)]
    if found:
        return found
    share = max(1, block_ms // len(by_client))
    for client, streams in by_client.values():
        if found := _read(client, streams, share, count):
            return found
    return []


def _read(
    client: redis.Redis, streams: dict[str, bytes], block_ms: int | None, count: int
) -> list[tuple[str, list[tuple[bytes, dict]]]]:
    # Any: redis-py types replies for both decode modes; these clients' are bytes (worker.connection).
    reply: Any = client.xread(streams, block=block_ms, count=count)  # type: ignore[arg-type]
    return [(k.decode() if isinstance(k, bytes) else k, entries) for k, entries in reply or []]

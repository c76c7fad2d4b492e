"""The Python client in cluster mode: submit to a shard, optionally confirmed by replicas (WAIT), and read
the job's events from the same shard's output stream (worker.client's reader on that shard's master).

The client chooses the shard by worker/shard_choice.py's rule, the same as on one Redis.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import redis
from redis.cluster import RedisCluster

from worker import client as single
from worker.affinity_key import with_affinity
from worker.cluster.connect import shard_client
from worker.cluster.shard_keys import ShardedKeys
from worker.keys import JOB_FIELD, Keys
from worker.shard_choice import choose_shard


class NotReplicated(RuntimeError):
    """WAIT saw fewer replicas than asked: the job was queued but a failover now may lose it."""


class ClusterClient:
    """Also a worker.job_queue.JobQueue (for `conveyor batch` and `conveyor demo`)."""

    def __init__(self, cluster: RedisCluster, sharded: ShardedKeys | None = None, replicas: int = 0) -> None:
        self.cluster, self.sharded = cluster, sharded or ShardedKeys()
        self.replicas = replicas  # submit()'s default
        self._clients: dict[int, redis.Redis] = {}

    @property
    def shards(self) -> int:
        return self.sharded.shards

    def keys(self, shard: int) -> Keys:
        return self.sharded.shard(shard)

    def node(self, shard: int) -> redis.Redis:
        """A client on the master of the shard's slot (it follows a failover)."""
        if shard not in self._clients:
            self._clients[shard] = shard_client(self.cluster, self.sharded.shard(shard).requests)
        return self._clients[shard]

    def submit(
        self, job: dict, shard: int | None = None, replicas: int | None = None, wait_ms: int = 1000
    ) -> int:
        """XADD the job to its shard's request stream; with replicas > 0 (default: self.replicas) also WAIT
        for that many replicas to have it (raises NotReplicated when they did not within wait_ms). Returns
        the shard."""
        replicas = self.replicas if replicas is None else replicas
        job = with_affinity(job)  # the default key (worker/affinity_key.py) when it has none
        k = choose_shard(job, self.sharded.shards) if shard is None else shard
        pipe = self.node(k).pipeline(transaction=False)  # one connection: WAIT covers this XADD
        pipe.xadd(self.sharded.shard(k).requests, {JOB_FIELD: json.dumps(job)})
        if replicas > 0:
            pipe.execute_command("WAIT", replicas, wait_ms)
        replies = pipe.execute()
        if replicas > 0 and int(replies[-1]) < replicas:
            raise NotReplicated(f"job {job['id']} reached {replies[-1]} of {replicas} replicas")
        return k

    def events(self, job_id: str, shard: int, timeout_s: float = 300) -> Iterator[dict]:
        return single.events(self.node(shard), job_id, self.sharded.shard(shard), timeout_s=timeout_s)

    def collect(self, job_id: str, shard: int, timeout_s: float = 300) -> list[dict]:
        return list(self.events(job_id, shard, timeout_s))

    def cancel(self, job_id: str, shard: int) -> None:
        """The cancel key (seen within a step) and the shard's cancel channel (SPUBLISH)."""
        keys = self.sharded.shard(shard)
        client = self.node(shard)
        client.set(keys.cancel(job_id), 1, ex=3600)
        client.execute_command("SPUBLISH", keys.cancel_channel, job_id)

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self.cluster.close()

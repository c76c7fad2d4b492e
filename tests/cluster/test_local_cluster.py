"""LocalCluster: shards spread evenly over the masters (spread_shards), and a cluster of one master."""

from __future__ import annotations

import shutil
from collections import Counter

import pytest

from worker.cluster import local_cluster
from worker.cluster.shard_keys import ShardedKeys

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(120)]


def per_master(cluster, keys: list[str]) -> list[int]:
    held = Counter(cluster.master_of(key).port for key in keys)
    return sorted(held.get(port, 0) for port in masters(cluster))


def masters(cluster) -> list[int]:
    import redis

    with redis.cluster.RedisCluster(host="127.0.0.1", port=cluster.servers[0].port) as client:
        return [n.port for n in client.get_primaries()]


def test_six_shards_two_on_each_master_then_eight_three_three_two(tmp_path):
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        pytest.skip("redis-server and redis-cli are needed")
    cluster = local_cluster.start(tmp_path, replicas=0)
    try:
        six = [k.requests for k in ShardedKeys("conveyor", 6).all()]
        assert per_master(cluster, six) == [1, 1, 4]  # the even slot ranges as created
        cluster.node(cluster.master_of(six[5]).port).set(six[5], "kept")  # a key on a slot that moves
        cluster.spread_shards(six)
        assert per_master(cluster, six) == [2, 2, 2]
        assert cluster.node(cluster.master_of(six[5]).port).get(six[5]) == b"kept"
        eight = [k.requests for k in ShardedKeys("conveyor", 8).all()]
        cluster.spread_shards(eight)
        assert per_master(cluster, eight) == [2, 3, 3]
        cluster.wait_ok()
    finally:
        cluster.stop()


def test_a_one_master_cluster_with_its_replica(tmp_path):
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is needed")
    cluster = local_cluster.start(tmp_path, masters=1, replicas=1)
    try:
        master, replica = cluster.servers
        six = [k.requests for k in ShardedKeys("conveyor", 6).all()]
        assert {cluster.master_of(key).port for key in six} == {master.port}
        with cluster.node(master.port) as node:
            node.set(six[0], "x")
            assert node.execute_command("WAIT", 1, 5000) == 1  # the replica follows it
        with cluster.node(replica.port) as node:
            assert node.info("replication")["role"] == "slave"
    finally:
        cluster.stop()

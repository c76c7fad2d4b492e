"""One real Redis Cluster (3 masters, 3 replicas, loopback) per test module, each server stopped by PID."""

from __future__ import annotations

import shutil
from contextlib import contextmanager

import pytest

from tests.helpers.worker_fakes import on_a_thread
from worker.cluster import local_cluster
from worker.cluster.client import ClusterClient
from worker.cluster.connect import connect_cluster
from worker.cluster.shard_keys import ShardedKeys
from worker.config import WorkerConfig
from worker.run.build import build

SHARDS = 8


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        pytest.skip("redis-server and redis-cli are needed")
    started = local_cluster.start(tmp_path_factory.mktemp("cluster"))
    yield started
    started.stop()


@pytest.fixture
def client(cluster):
    """A cluster client on an emptied cluster."""
    rc = connect_cluster(cluster.url)
    rc.flushall(target_nodes=rc.PRIMARIES)
    c = ClusterClient(rc, ShardedKeys("conveyor", SHARDS))
    yield c
    c.close()


@contextmanager
def sharded_worker(engine, url: str, consumer: str, **overrides):
    """A worker with a lane per shard on a thread; drained on exit."""
    cfg = WorkerConfig(
        **{
            "group": "test",
            "consumer": consumer,
            "lease_ms": 3000,
            "cluster": True,
            "shards": SHARDS,
            **overrides,
        }
    )
    with on_a_thread(build(engine, connect_cluster(url), cfg)) as worker:
        yield worker


def assert_each_done_once(client, placed: dict[str, int], engine, num_tokens: int) -> None:
    """Every job of `placed` (id "<letter><i>" -> shard, submitted with prompt f"q{i}" and seed i) streamed
    tokens 0..num_tokens-1 without gap or repeat and exactly one "done", last, with the engine's text."""
    for job_id, shard in placed.items():
        events = client.collect(job_id, shard, timeout_s=60)
        i = int(job_id[1:])
        tokens = [e for e in events if e["type"] == "token"]
        assert [e["index"] for e in tokens] == list(range(num_tokens)), (job_id, events[-1])
        assert [e["type"] for e in events].count("done") == 1 and events[-1]["type"] == "done"
        assert events[-1]["text"] == engine.expected_text(f"q{i}", num_tokens, seed=i)

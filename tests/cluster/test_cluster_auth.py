"""A Redis Cluster whose nodes require a password (requirepass, and masterauth for the replicas): the
password in --redis-url reaches every per-shard and per-node connection of workers and clients."""

from __future__ import annotations

import shutil

import pytest
import redis
from click.testing import CliRunner
from redis.exceptions import RedisClusterException

from tests.cluster.conftest import SHARDS, sharded_worker
from tests.helpers.worker_fakes import FakeEngine
from worker.affinity_key import with_affinity
from worker.cli.main import main
from worker.cluster import local_cluster
from worker.cluster.client import ClusterClient
from worker.cluster.connect import connect_cluster
from worker.cluster.shard_keys import ShardedKeys
from worker.shard_choice import choose_shard

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(120)]

PASSWORD = "cluster-secret"


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        pytest.skip("redis-server and redis-cli are needed")
    started = local_cluster.start(tmp_path_factory.mktemp("secured"), password=PASSWORD)
    yield started
    started.stop()


def test_workers_and_clients_pass_the_urls_password_to_every_node(secured):
    assert secured.url.startswith(f"redis://:{PASSWORD}@")
    engine = FakeEngine()
    client = ClusterClient(connect_cluster(secured.url), ShardedKeys("conveyor", SHARDS))
    try:
        with sharded_worker(engine, secured.url, "w1"):
            # replicas=1: WAIT answers only once a replica, authenticated with masterauth, has the job.
            placed = {
                f"a{i}": client.submit({"id": f"a{i}", "prompt": f"p{i}", "max_tokens": 3}, replicas=1)
                for i in range(16)
            }
            assert set(placed.values()) == set(range(SHARDS))
            for job_id, shard in placed.items():
                events = client.collect(job_id, shard, timeout_s=30)
                assert events[-1]["type"] == "done"
                assert events[-1]["text"] == engine.expected_text(f"p{job_id[1:]}", 3)
            run = CliRunner().invoke(
                main,
                ["submit", "hello", "--id", "cli1", "--max-tokens", "4", "--redis-url", secured.url]
                + ["--cluster", "--shards", str(SHARDS), "--replicas", "1", "--timeout", "30"],
            )
            assert run.exit_code == 0, run.output
            # (the in-process worker logs to the same stdout: read the job back from its stream)
            events = client.collect(
                "cli1", choose_shard(with_affinity({"id": "cli1", "prompt": "hello"}), SHARDS), timeout_s=10
            )
            assert events[-1]["type"] == "done" and events[-1]["text"] == engine.expected_text("hello", 4)
    finally:
        client.close()


def test_a_wrong_or_missing_password_is_refused(secured):
    port = secured.servers[0].port
    for url in (f"redis://:wrong@127.0.0.1:{port}", f"redis://127.0.0.1:{port}"):
        with pytest.raises((redis.AuthenticationError, RedisClusterException), match="(?i)auth|password"):
            connect_cluster(url).ping()

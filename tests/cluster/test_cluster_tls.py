"""A Redis Cluster spoken to over TLS only (rediss://, client certificates): the TLS options reach every
per-shard connection of the worker and of the client (the node addresses the cluster reports are its
TLS ports, since `tls-cluster yes`)."""

from __future__ import annotations

import shutil

import pytest
import redis

from tests.cluster.conftest import SHARDS
from tests.helpers.worker_fakes import FakeEngine, on_a_thread
from tests.reliability.test_rel_security import make_certs
from worker import local_redis
from worker.cluster import local_cluster
from worker.cluster.client import ClusterClient
from worker.cluster.connect import connect_cluster
from worker.cluster.shard_keys import ShardedKeys
from worker.config import WorkerConfig
from worker.connection import TlsOptions
from worker.run.build import build

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory):
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        pytest.skip("redis-server and redis-cli are needed")
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make test certificates")
    folder = tmp_path_factory.mktemp("tls")
    certs = make_certs(folder)
    tls_ports: dict[int, int] = {}

    def tls_args(port: int) -> list[str]:
        # With tls-cluster the bus listens on the TLS port + 10000: the pair must be free, the port <= 55535.
        tls_ports[port] = local_cluster.cluster_port()
        return [
            "--tls-port", str(tls_ports[port]), "--tls-cert-file", certs["server_cert"],
            "--tls-key-file", certs["server_key"], "--tls-ca-cert-file", certs["ca"],
            "--tls-auth-clients", "yes", "--tls-cluster", "yes", "--tls-replication", "yes",
        ]  # fmt: skip

    try:  # one plain server with a TLS port first: is redis-server built with TLS?
        local_redis.start(extra_args=tls_args(0)[:-4]).stop()  # (not a cluster node: no tls-cluster)
    except RuntimeError as exc:
        pytest.skip(f"redis-server was not built with TLS support: {exc}")
    del tls_ports[0]
    started = local_cluster.start(folder / "cluster", node_args=tls_args)
    url = f"rediss://127.0.0.1:{tls_ports[started.servers[0].port]}"
    yield url, TlsOptions(certs["ca"], certs["cert"], certs["key"]), set(tls_ports.values())
    started.stop()


def test_jobs_run_over_tls_on_every_shard(tls_cluster):
    url, tls, tls_port_set = tls_cluster
    client = ClusterClient(connect_cluster(url, tls), ShardedKeys("conveyor", SHARDS))
    engine = FakeEngine()
    cfg = WorkerConfig(group="test", consumer="w1", lease_ms=3000, cluster=True, shards=SHARDS)
    try:
        with on_a_thread(build(engine, connect_cluster(url, tls), cfg)) as worker:
            placed = {
                f"t{i}": client.submit({"id": f"t{i}", "prompt": f"p{i}", "max_tokens": 3}) for i in range(16)
            }
            for job_id, shard in placed.items():
                events = client.collect(job_id, shard, timeout_s=30)
                assert events[-1]["type"] == "done"
                assert events[-1]["text"] == engine.expected_text(f"p{job_id[1:]}", 3)
            pools = [w.client.connection_pool for w in worker.lanes]
            assert all(issubclass(p.connection_class, redis.SSLConnection) for p in pools)
            assert {p.connection_kwargs["port"] for p in pools} <= tls_port_set  # TLS ports only
    finally:
        client.close()

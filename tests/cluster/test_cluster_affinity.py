"""Prefix affinity in cluster mode (`--cluster --affinity`): two workers split the shards through the
registry, keyed jobs run exactly once, and cancels, dead letters and deadlines hold with affinity on."""

from __future__ import annotations

import time
from contextlib import ExitStack, contextmanager

import pytest

from tests.cluster.conftest import SHARDS
from tests.helpers.waiting import wait_until
from tests.helpers.worker_fakes import FakeEngine, on_a_thread
from worker.cluster.connect import connect_cluster
from worker.config import WorkerConfig
from worker.fleet.heartbeat import Heartbeat
from worker.fleet.home_shards import home_shards
from worker.fleet.home_watch import use_home_shards
from worker.keys import JOB_FIELD, Keys
from worker.run.build import build

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(180)]


@contextmanager
def affinity_worker(engine, url: str, consumer: str):
    cfg = WorkerConfig(
        group="test",
        consumer=consumer,
        lease_ms=3000,
        cluster=True,
        shards=SHARDS,
        affinity=True,
        registry_interval_s=0.2,
    )
    rc = connect_cluster(url)
    w = build(engine, rc, cfg)
    streams = [lane.stream for lane in w.lanes]
    w.observer.heartbeat = Heartbeat(
        rc, Keys(), consumer=consumer, model="fake", group="test", streams=streams, max_model_len=512,
        capacity=engine.max_num_seqs, interval_s=0.2,
    )  # fmt: skip
    use_home_shards(w, rc, cfg, w.observer.heartbeat)
    try:
        with on_a_thread(w):
            yield w
    finally:
        w.observer.heartbeat.stop()


def test_keyed_jobs_once_and_cancel_dead_letters_deadlines_with_affinity_on(cluster, client):
    engines = [FakeEngine(max_num_seqs=4, step_s=0.01) for _ in range(2)]
    with ExitStack() as stack:
        workers = [
            stack.enter_context(affinity_worker(e, cluster.url, f"w{i}")) for i, e in enumerate(engines)
        ]
        split = home_shards(SHARDS, ["w0", "w1"])
        wait_until(lambda: [w.policy.home for w in workers] == [split["w0"], split["w1"]], 20, "homes split")
        placed = {
            f"k{i}": client.submit({"id": f"k{i}", "prompt": f"Doc {i % 6}. " + "x" * 300, "max_tokens": 4})
            for i in range(24)
        }
        assert len(set(placed.values())) <= 6  # one shard per key: 6 keys
        # nothing weaker: a cancel, a refused job, an overdue job, all on keyed shards
        long = client.submit({"id": "c1", "prompt": "Doc 0. long", "max_tokens": 400})
        bad = client.submit({"id": "bad1", "prompt": "Doc 1. " + "x" * 300, "max_tokens": "5"})
        late_ms = int(time.time() * 1000) - 1000
        late = client.submit({"id": "late", "prompt": "Doc 2. " + "x" * 300, "deadline_ms": late_ms})
        wait_until(lambda: client.node(long).xlen(client.sharded.shard(long).out("c1")) >= 3, 30, "c1 runs")
        client.cancel("c1", long)
        for job_id, shard in placed.items():
            events = client.collect(job_id, shard, timeout_s=60)
            kinds = [e["type"] for e in events]
            assert kinds.count("done") == 1 and kinds[-1] == "done", job_id
            assert [e["index"] for e in events if e["type"] == "token"] == [0, 1, 2, 3]
        cancelled = client.collect("c1", long, timeout_s=30)[-1]
        refused = client.collect("bad1", bad, timeout_s=30)[-1]
        overdue = client.collect("late", late, timeout_s=30)[-1]
        reads = sum(w.policy.from_home + w.policy.stolen for w in workers)
    assert cancelled["finish_reason"] == "abort" and cancelled["reason"] == "cancel"
    assert refused["type"] == "error" and refused["code"] == "invalid_job"
    assert overdue["type"] == "error" and overdue["code"] == "deadline_exceeded"
    dead = client.node(bad).xrange(client.sharded.shard(bad).dead)
    assert any(b"bad1" in fields[JOB_FIELD] for _, fields in dead)
    assert reads == 27  # every job read once (by one worker, from home or stolen)
    for k in range(SHARDS):
        group = client.node(k).xinfo_groups(client.sharded.shard(k).requests)[0]
        assert group["pending"] == 0 and group["lag"] == 0

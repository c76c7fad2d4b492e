"""Live resharding: one shard's slot migrates to another master while a worker runs; the worker follows
(MOVED / ASK / TRYAGAIN make its pool ask the cluster again) and every job finishes exactly once."""

from __future__ import annotations

import pytest

from tests.cluster.conftest import SHARDS, assert_each_done_once, sharded_worker
from tests.helpers.waiting import wait_until
from tests.helpers.worker_fakes import FakeEngine

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(120)]


def test_a_slot_moved_mid_run_every_job_finishes_once(cluster, client):
    engine = FakeEngine(step_s=0.01)
    moving = 3
    keys = client.sharded.shard(moving)
    with sharded_worker(engine, cluster.url, "w1"):
        placed = {}
        for i in range(48):
            job = {"id": f"m{i}", "prompt": f"q{i}", "max_tokens": 25, "seed": i}
            placed[job["id"]] = client.submit(job, shard=i % SHARDS)
        on_moving = [j for j, k in placed.items() if k == moving]
        wait_until(
            lambda: any(client.node(moving).xlen(keys.out(j)) >= 5 for j in on_moving),
            30,
            "tokens on the shard",
        )
        source = cluster.master_of(keys.requests)
        target = next(
            s
            for s in cluster.servers
            if s is not source and cluster.node(s.port).info("replication")["role"] == "master"
        )
        cluster.move_slot(keys.requests, target)
        assert cluster.master_of(keys.requests) is target
        assert_each_done_once(client, placed, engine, 25)
    for k in range(SHARDS):
        group = client.node(k).xinfo_groups(client.sharded.shard(k).requests)[0]
        assert group["pending"] == 0 and group["lag"] == 0, (k, group)

"""kill -9 of a master mid-run: its replica takes over, and every job whose submission WAIT confirmed
finishes exactly once, with token indices without gap or repeat. Its own cluster (this one is damaged)."""

from __future__ import annotations

import time

import pytest

from tests.cluster.conftest import SHARDS, assert_each_done_once, sharded_worker
from tests.helpers.waiting import wait_until
from tests.helpers.worker_fakes import FakeEngine

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(120)]


def test_jobs_confirmed_by_wait_survive_a_master_failover(cluster, client):
    engines = [FakeEngine(max_num_seqs=8, step_s=0.01), FakeEngine(max_num_seqs=8, step_s=0.01)]
    victim = cluster.master_of(client.sharded.shard(0).requests)
    on_victim = [k for k in range(SHARDS) if cluster.master_of(client.sharded.shard(k).requests) is victim]
    with sharded_worker(engines[0], cluster.url, "w1"), sharded_worker(engines[1], cluster.url, "w2"):
        placed = {}
        for i in range(120):
            job = {"id": f"f{i}", "prompt": f"q{i}", "max_tokens": 30, "seed": i}
            placed[job["id"]] = client.submit(job, replicas=1)  # raises unless a replica has it
        # Kill while jobs of the victim's shards are half-way: some tokens out, not all jobs done.
        first = client.sharded.shard(on_victim[0])
        wait_until(
            lambda: any(
                client.node(on_victim[0]).xlen(first.out(j)) >= 10
                for j, k in placed.items()
                if k in on_victim
            ),
            30,
            "tokens on the victim's shards",
        )
        killed_at = time.monotonic()
        cluster.kill(victim)
        assert cluster.wait_promoted(first.requests) is not victim  # a replica was promoted
        assert_each_done_once(client, placed, engines[0], 30)
        assert time.monotonic() - killed_at < 60
    for k in range(SHARDS):
        keys = client.sharded.shard(k)
        group = client.node(k).xinfo_groups(keys.requests)[0]
        assert group["pending"] == 0 and group["lag"] == 0, (k, group)

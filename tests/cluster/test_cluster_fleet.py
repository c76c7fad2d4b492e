"""The fleet view and accounting in cluster mode: usage counters in each shard's slot, summed by the
snapshot; one shared engine step's wall time shared out over every shard's jobs."""

from __future__ import annotations

import time

import pytest

from tests.cluster.conftest import SHARDS, sharded_worker
from tests.helpers.worker_fakes import FakeEngine
from worker.cluster.connect import connect_cluster
from worker.fleet.read_fleet import take

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(120)]


def test_usage_across_shards_equals_the_jobs_usage_and_the_steps_wall_time(cluster, client):
    engine = FakeEngine(step_s=0.005)
    stepped: list[float] = []
    step = engine.step

    def timed_step():
        began = time.perf_counter()
        try:
            return step()
        finally:
            stepped.append(time.perf_counter() - began)

    engine.step = timed_step  # type: ignore[method-assign]
    placed = {}
    with sharded_worker(engine, cluster.url, "w1"):
        for k in range(16):
            job = {"id": f"f{k}", "prompt": f"q{k}", "max_tokens": 3 + k, "tenant": ["t1", "t2"][k % 2]}
            placed[job["id"]] = (client.submit(job), job["tenant"])
        expected: dict[str, list[int]] = {"t1": [0, 0, 0], "t2": [0, 0, 0]}
        for job_id, (shard, tenant) in placed.items():
            done = client.collect(job_id, shard, timeout_s=60)[-1]
            assert done["type"] == "done"
            sums = expected[tenant]
            sums[0] += 1
            sums[1] += done["usage"]["prompt_tokens"]
            sums[2] += done["usage"]["completion_tokens"]
    assert len({shard for shard, _ in placed.values()}) > 1  # the jobs went to several shards
    rc = connect_cluster(cluster.url)
    shards = tuple(client.sharded.shard(k).requests for k in range(SHARDS))
    snap = take(rc, "conveyor", shards)
    found = {u.tenant: u for u in snap.tenants}
    for tenant, (jobs, prompt, completion) in expected.items():
        u = found[tenant]
        assert (u.model, u.jobs, u.prompt_tokens, u.completion_tokens) == ("test", jobs, prompt, completion)
    assert sum(u.engine_seconds for u in found.values()) == pytest.approx(sum(stepped), rel=0.05)
    [model] = snap.models
    assert (model.group, model.backlog, model.pending, len(model.streams)) == ("test", 0, 0, SHARDS)

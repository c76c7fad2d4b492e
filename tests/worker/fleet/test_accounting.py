"""Per-tenant accounting (worker/fleet/accounting.py): the Redis counters a real worker writes with each
job's terminal event equal the jobs' `usage`, and engine-seconds add up to the engine steps' wall time."""

from __future__ import annotations

import time

import pytest

from tests.helpers.worker_fakes import real_engine, running_worker
from worker.client import collect, enqueue
from worker.fleet import accounting
from worker.keys import Keys


def test_a_step_is_split_by_tokens_computed():
    shares = accounting.split_step(2.0, {"prefill": 30, "decode": 1, "fork": 0, "other": 9})
    assert shares == pytest.approx({"prefill": 1.5, "decode": 0.05, "other": 0.45})
    assert accounting.split_step(1.0, {"a": 0}) == {}


def test_fields_are_summed_per_tenant_and_model_across_hashes():
    shard0 = {b"jobs:a:m:1": b"2", b"prompt_tokens:a:m:1": b"10", b"engine_us:a:m:1": b"1500000"}
    shard1 = {b"jobs:a:m:1": b"1", b"completion_tokens:b:m2": b"7", b"unknown:x:y": b"1"}
    a, b = sorted(accounting.parse([shard0, shard1]), key=lambda u: u.tenant)
    assert (a.tenant, a.model, a.jobs, a.prompt_tokens, a.engine_seconds) == ("a", "m:1", 3, 10, 1.5)
    assert (b.tenant, b.model, b.completion_tokens) == ("b", "m2", 7)


@pytest.mark.redis
@pytest.mark.timeout(240)
def test_counters_equal_the_jobs_usage_and_engine_time_the_steps_wall_time(redis_server, r, tiny_model):
    engine = real_engine(tiny_model, max_num_batched_tokens=64)  # long prompts prefill in chunks
    stepped = []
    step = engine.step

    def timed_step():
        began = time.perf_counter()
        try:
            return step()
        finally:
            stepped.append(time.perf_counter() - began)

    engine.step = timed_step  # type: ignore[method-assign]
    jobs = []
    for k in range(9):
        tenant = ["alpha", "beta", None][k % 3]
        job = {"id": f"j{k}", "prompt": "word " * (5 + 20 * k), "max_tokens": 3 + 4 * k, "ignore_eos": True}
        jobs.append(({**job, "tenant": tenant} if tenant else job, tenant or "default"))
    usage: dict[str, list[int]] = {}
    with running_worker(engine, redis_server.url):
        for job, _ in jobs:
            enqueue(r, job)
        for job, tenant in jobs:
            done = collect(r, job["id"], timeout_s=120)[-1]
            assert done["type"] == "done"
            sums = usage.setdefault(tenant, [0, 0, 0])
            sums[0] += 1
            sums[1] += done["usage"]["prompt_tokens"]
            sums[2] += done["usage"]["completion_tokens"]
    found = {u.tenant: u for u in accounting.parse([r.hgetall(Keys().usage)])}
    assert sorted(found) == ["alpha", "beta", "default"]
    for tenant, (count, prompt, completion) in usage.items():
        u = found[tenant]
        assert (u.model, u.jobs, u.prompt_tokens, u.completion_tokens) == ("test", count, prompt, completion)
    engine_s = sum(u.engine_seconds for u in found.values())
    assert engine_s == pytest.approx(sum(stepped), rel=0.05)
    assert all(u.engine_seconds > 0 for u in found.values())

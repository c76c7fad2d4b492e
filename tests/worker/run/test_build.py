"""Priority and tenant lanes served by a real engine (the tiny model) through a real Redis
(the layout's worker from run/build.py, read by the one loop): jobs go to their lanes through the Python client, and
the order the worker admits them in ("job admitted" log lines) and the tokens their done events report
show that smaller priorities run first across the backlog and that tenants share by weight."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from structlog.testing import capture_logs

from tests.helpers.rel_helpers import wait_terminal
from tests.helpers.waiting import wait_until
from tests.helpers.worker_fakes import on_a_thread, real_engine
from worker.client import enqueue
from worker.config import WorkerConfig
from worker.connection import connect
from worker.intake.lane_layout import priority_layout, tenant_layout
from worker.keys import Keys
from worker.run.build import build

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]
KEYS = Keys()


def _job(job_id: str, max_tokens: int, **fields) -> dict:
    # ignore_eos: every job gives exactly max_tokens tokens, whatever the random model samples.
    return {
        "id": job_id,
        "prompt_token_ids": [5, 6, 7],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        **fields,
    }


def _admitted(logs: list[dict]) -> list[str]:
    return [e["request_id"] for e in list(logs) if e.get("event") == "job admitted"]


def _at(entry_id: bytes, events: list[dict], timing: str) -> float:
    """When (ms) the job reached `timing` (queue_ms: admitted, ttft_ms: first token, total_ms: finished):
    its enqueue time, the entry id's ms, plus the done event's figure."""
    return int(entry_id.split(b"-")[0]) + events[-1]["timing"][timing]


def _cfg() -> WorkerConfig:
    return WorkerConfig(group="test", consumer="w1", lease_ms=3000)


def test_a_priority_0_job_queued_behind_eight_of_priority_10_finishes_first(redis_server, tiny_model):
    client = connect(redis_server.url)
    client.flushall()
    worker = build(real_engine(tiny_model, max_num_seqs=2), client, _cfg(), priority_layout(KEYS, [0, 10]))
    entries = {f"bulk{i}": enqueue(client, _job(f"bulk{i}", 6, priority=10), KEYS) for i in range(8)}
    entries["urgent"] = enqueue(client, _job("urgent", 6), KEYS)  # last in, priority 0
    assert client.xlen("conveyor:requests:p10") == 8 and client.xlen("conveyor:requests") == 1
    with capture_logs() as logs, on_a_thread(worker):
        done = wait_terminal(client, list(entries), timeout_s=60)
    assert all(events[-1]["type"] == "done" for events in done.values())
    finished = sorted(entries, key=lambda j: _at(entries[j], done[j], "total_ms"))
    assert _admitted(logs)[0] == "urgent" and finished[0] == "urgent", (_admitted(logs), finished)


def test_a_priority_0_job_arriving_during_a_flood_is_read_next(redis_server, tiny_model):
    client = connect(redis_server.url)
    client.flushall()
    worker = build(real_engine(tiny_model, max_num_seqs=2), client, _cfg(), priority_layout(KEYS, [0, 10]))
    bulk = [f"bulk{i}" for i in range(8)]
    for job_id in bulk:
        enqueue(client, _job(job_id, 24, priority=10), KEYS)
    with capture_logs() as logs, on_a_thread(worker):
        wait_until(lambda: len(_admitted(logs)) >= 2, 30, "the first jobs of the flood admitted")
        enqueue(client, _job("urgent", 4), KEYS)
        already = len(_admitted(logs))
        wait_terminal(client, ["urgent", *bulk], timeout_s=60)
    order = _admitted(logs)
    # At most one round of reads built before the XADD (room 2) may still come first.
    assert order.index("urgent") <= already + 2 and already + 2 < len(bulk), order


def _token_times(entry_id: bytes, events: list[dict]) -> list[float]:
    """When each of a finished job's tokens was served (ms): its token events are written from its first
    token's time to its last, one step apart (steps of one job's batch take about equal time)."""
    first, last = _at(entry_id, events, "ttft_ms"), _at(entry_id, events, "total_ms")
    n = events[-1]["usage"]["completion_tokens"]
    return [first + (last - first) * i / max(1, n - 1) for i in range(n)]


@pytest.mark.parametrize("weight_a, weight_b", [(1, 1), (3, 1)])
def test_a_flooding_tenant_shares_by_weight_and_cannot_delay_another(
    redis_server, tiny_model, weight_a, weight_b
):
    """Tenant a queues 200 jobs, then tenant b 20: b's first job is read within two batch turnovers, and
    while both have a backlog (from b's first token until b's last job is read) the completion tokens
    served split as the weights, within 15%."""
    client = connect(redis_server.url)
    client.flushall()
    seqs, tokens = 4, 4
    layout = tenant_layout(KEYS, ["a", "b"])
    engine = real_engine(tiny_model, max_num_seqs=seqs)
    worker = build(engine, client, _cfg(), layout, {"a": weight_a, "b": weight_b})
    entries = {f"a{i}": enqueue(client, _job(f"a{i}", tokens, tenant="a"), KEYS) for i in range(200)}
    b_jobs = [f"b{i}" for i in range(20)]
    with capture_logs() as logs, on_a_thread(worker):
        wait_until(lambda: len(_admitted(logs)) >= 2 * seqs, 30, "tenant a served alone for a while")
        before = len(_admitted(logs))
        for job_id in b_jobs:
            entries[job_id] = enqueue(client, _job(job_id, tokens, tenant="b"), KEYS)
        wait_terminal(client, b_jobs, timeout_s=60)
    order = _admitted(logs)
    first_b = next(i for i, j in enumerate(order) if j.startswith("b"))
    assert first_b - before <= 2 * seqs, order[before : first_b + 1]  # not after a's backlog
    done = wait_terminal(client, order, timeout_s=30)  # a's jobs in flight at the stop were drained
    times = {job_id: _token_times(entries[job_id], events) for job_id, events in done.items()}
    start = min(times[j][0] for j in b_jobs)  # b's first token
    end = max(_at(entries[j], done[j], "queue_ms") for j in b_jobs)  # b's last job read
    served = {"a": 0, "b": 0}
    for job_id, at in times.items():
        served[job_id[0]] += sum(start <= t <= end for t in at)
    ratio = served["a"] / served["b"]
    assert abs(ratio / (weight_a / weight_b) - 1) <= 0.15, (served, order[first_b:])


def test_a_tenant_first_seen_at_run_time_gets_its_own_share_without_a_restart(redis_server, tiny_model):
    """Issue 43 row 16: tenants not named by --tenant-weight shared the default lane, so one flooding it
    delayed the others. Now each gets a lane of weight 1 within a registry interval of its first job:
    `late`, arriving behind 200 jobs of `flood` (neither named), is read long before flood's
    backlog, sharing 1:1 with it, and both lanes show in the worker's registry record."""
    from worker.fleet.heartbeat import Heartbeat

    client = connect(redis_server.url)
    client.flushall()
    seqs, tokens = 4, 4
    layout = tenant_layout(KEYS, ["a"])
    cfg = replace(_cfg(), registry_interval_s=0.2)
    worker = build(real_engine(tiny_model, max_num_seqs=seqs), client, cfg, layout, {})
    beat = Heartbeat(
        client,
        KEYS,
        consumer="t",
        model="tiny",
        group="g",
        streams=layout.streams,
        max_model_len=256,
        capacity=4,
    )
    worker.observer.heartbeat = beat
    entries = {f"f{i}": enqueue(client, _job(f"f{i}", tokens, tenant="flood"), KEYS) for i in range(200)}
    assert client.xlen("conveyor:requests:t:flood") == 200 and client.smembers(layout.tenants_key) == {
        b"flood"
    }
    late = [f"l{i}" for i in range(10)]
    with capture_logs() as logs, on_a_thread(worker):
        wait_until(lambda: len(_admitted(logs)) >= 2 * seqs, 30, "tenant flood served alone for a while")
        before = len(_admitted(logs))
        for job_id in late:
            entries[job_id] = enqueue(client, _job(job_id, tokens, tenant="late"), KEYS)
        wait_terminal(client, late, timeout_s=60)
        beat.beat()
        record = json.loads(client.get(KEYS.worker("t")))
    order = _admitted(logs)
    at = [i for i, j in enumerate(order) if j.startswith("l")]
    # Its lane is read once the worker has seen the tenant (one registry interval), then shares with
    # flood's: late's ten jobs are all read long before flood's backlog of 200 is.
    assert at[0] < 100 and at[-1] - at[0] <= 3 * len(late), (before, at)
    assert {"conveyor:requests:t:flood", "conveyor:requests:t:late"} <= set(record["streams"])
    assert worker.policy.weights == [1.0, 1.0, 1.0, 1.0]  # default, a, then flood and late at weight 1
    said = [e for e in logs if e.get("event") == "tenant lane added"]
    assert [e["tenant"] for e in said] == ["flood", "late"]
    beat.stop()


def test_jobs_without_a_tenant_share_the_default_lane_and_every_tenant_has_its_own(redis_server, tiny_model):
    client = connect(redis_server.url)
    client.flushall()
    layout = tenant_layout(KEYS, ["a"])
    worker = build(real_engine(tiny_model, max_num_seqs=2), client, _cfg(), layout, {"default": 2})
    jobs = [_job("named", 3, tenant="a"), _job("other", 3, tenant="zz"), _job("none", 3)]
    for job in jobs:
        enqueue(client, job, KEYS)
    assert client.xlen("conveyor:requests:t:a") == 1 and client.xlen("conveyor:requests") == 1
    assert client.xlen("conveyor:requests:t:zz") == 1
    with on_a_thread(worker):
        done = wait_terminal(client, [j["id"] for j in jobs], timeout_s=60)
    assert [done[j["id"]][-1]["usage"]["completion_tokens"] for j in jobs] == [3, 3, 3]
    assert worker.policy.weights == [2, 1, 1]  # the default lane, tenant a, then zz once seen

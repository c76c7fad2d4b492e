"""`conveyor top --once --json` (worker/fleet/read_fleet.py): its numbers equal what Redis holds."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from worker.fleet.heartbeat import Heartbeat
from worker.fleet.snapshot import DRAIN_CAP_S, ModelView, drain_seconds, quantile
from worker.keys import Keys

K = Keys()


def top_json(url: str, *extra: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "worker.cli", "top", "--redis-url", url, "--once", "--json", *extra],
        capture_output=True,
        timeout=60,
        check=True,
    )
    return json.loads(out.stdout)


def test_quantiles_are_nearest_rank_and_drain_time_follows_the_rate():
    assert quantile([], 0.5) is None
    assert quantile([5, 1, 3, 2, 4], 0.5) == 3 and quantile(list(range(1, 101)), 0.99) == 99
    m = ModelView(model="m", group="m", streams=[], backlog=10, backlog_tokens=1000, tokens_out_per_s=50)
    assert drain_seconds(m) == 20  # 1000 tokens at 50 tok/s
    assert drain_seconds(m.model_copy(update={"tokens_out_per_s": 0})) == DRAIN_CAP_S  # nobody serving
    assert drain_seconds(m.model_copy(update={"backlog_tokens": None, "jobs_per_s": 2})) == 5
    assert drain_seconds(m.model_copy(update={"backlog": 0})) == 0


@pytest.mark.redis
@pytest.mark.timeout(120)
def test_once_json_equals_what_redis_holds(redis_server, r):
    # Model "alpha" on the default stream, model "beta" on a stream of its own that only a worker's
    # registry record names (as per-model streams are found).
    beta_stream = "conveyor:requests:beta"
    for k in range(7):
        r.xadd(K.requests, {"job": json.dumps({"id": f"a{k}", "prompt": "x"})})
    for k in range(4):
        r.xadd(beta_stream, {"job": json.dumps({"id": f"b{k}", "prompt": "x"})})
    r.xgroup_create(K.requests, "alpha", id="0")
    r.xgroup_create(beta_stream, "beta", id="0")
    r.xreadgroup("alpha", "c1", {K.requests: ">"}, count=3)
    r.xreadgroup("beta", "c2", {beta_stream: ">"}, count=1)
    r.xack(K.requests, "alpha", r.xpending_range(K.requests, "alpha", "-", "+", 1)[0]["message_id"])
    now_ms = int(time.time() * 1000)
    r.xadd(K.dead, {"code": "old"}, id=f"{now_ms - 2 * 3_600_000}-0")  # over an hour old: not counted
    r.xadd(K.dead, {"code": "invalid_json", "group": "alpha"})
    r.xadd(K.dead, {"code": "invalid_json", "group": "beta"})
    r.xadd(K.dead, {"code": "invalid_json", "group": "beta"})
    hb = Heartbeat(
        r,
        K,
        consumer="wb",
        model="beta-served",
        group="beta",
        streams=[beta_stream],
        max_model_len=64,
        capacity=4,
        interval_s=5,
    )
    hb.start()
    try:
        snap = top_json(redis_server.url)
    finally:
        hb.stop()
    models = {m["group"]: m for m in snap["models"]}
    assert sorted(models) == ["alpha", "beta"]
    for group, stream in (("alpha", K.requests), ("beta", beta_stream)):
        info = next(g for g in r.xinfo_groups(stream) if g["name"].decode() == group)
        assert models[group]["backlog"] == info["lag"]
        assert models[group]["pending"] == info["pending"]
        assert models[group]["streams"] == [stream]
    assert (models["alpha"]["backlog"], models["alpha"]["pending"]) == (4, 2)  # sanity: 7 - 3 read, 1 acked
    assert models["beta"]["model"] == "beta-served" and models["beta"]["workers"] == 1
    in_hour = len(r.xrange(K.dead, min=now_ms - 3_600_000))
    assert snap["dead_last_hour"] == in_hour == 3
    assert (models["alpha"]["dead_last_hour"], models["beta"]["dead_last_hour"]) == (1, 2)
    oldest = int(
        r.xrange(K.requests, min="(" + r.xinfo_groups(K.requests)[0]["last-delivered-id"].decode(), count=1)[
            0
        ][0].split(b"-")[0]
    )
    assert models["alpha"]["oldest_wait_s"] == pytest.approx((snap["taken_ms"] - oldest) / 1000, abs=0.01)
    assert [w["consumer"] for w in snap["workers"]] == ["wb"] and not snap["workers"][0]["lost"]


@pytest.mark.redis
def test_batches_in_progress_are_shown_until_closed_and_a_dead_drivers_goes_stale(redis_server, r):
    from worker.fleet.batch_board import STALE_MS, BatchBoard
    from worker.fleet.read_fleet import take

    board = BatchBoard(r, K.batches, "in.jsonl", total=10)
    board.update(3, 1, force=True)
    board.update(9, 1)  # within a second of the last write: not written
    [shown] = take(r).batches
    assert (shown.id, shown.total, shown.done, shown.failed) == (board.view.id, 10, 3, 1)
    assert shown.id.endswith(":in.jsonl")
    dead = board.view.model_copy(update={"id": "gone", "updated_ms": int(time.time() * 1000) - STALE_MS - 1})
    r.hset(K.batches, "gone", dead.model_dump_json())
    assert [b.id for b in take(r).batches] == [board.view.id]
    board.close()
    assert take(r).batches == []


def test_fleet_metrics_are_the_snapshots_numbers():
    from prometheus_client import CollectorRegistry, generate_latest

    from worker.fleet.accounting import TenantUsage
    from worker.fleet.fleet_metrics import FleetCollector
    from worker.fleet.snapshot import FleetSnapshot

    model = ModelView(model="m", group="g", streams=[], backlog=7, backlog_tokens=700, drain_s=3.5, pending=2)
    usage = TenantUsage(
        tenant="acme", model="m", jobs=2, prompt_tokens=10, completion_tokens=5, engine_seconds=1.25
    )
    snap = FleetSnapshot(
        taken_ms=0, models=[model], workers=[], tenants=[usage], batches=[], dead_last_hour=0
    )
    registry = CollectorRegistry()
    registry.register(FleetCollector(lambda: snap))
    text = generate_latest(registry).decode()
    for line in (
        'conveyor_backlog_jobs{model="m"} 7.0',
        'conveyor_backlog_tokens{model="m"} 700.0',
        'conveyor_backlog_drain_seconds{model="m"} 3.5',
        'conveyor_backlog_oldest_wait_seconds{model="m"} 0.0',
        'conveyor_fleet_pending_jobs{model="m"} 2.0',
        'conveyor_usage_completion_tokens_total{model="m",tenant="acme"} 5.0',
        'conveyor_usage_engine_seconds_total{model="m",tenant="acme"} 1.25',
    ):
        assert line in text.splitlines(), line

"""The worker registry (worker/fleet/): records, liveness by TTL, lost workers, a clean stop, the loop's numbers."""

from __future__ import annotations

import signal
import time

import pytest

from engine.outputs import EngineStats
from tests.helpers.waiting import wait_until
from tests.helpers.worker_fakes import spawn_worker
from worker.client import collect, enqueue
from worker.fleet import registry
from worker.fleet.heartbeat import Heartbeat
from worker.keys import Keys

K = Keys()


def stats(**overrides) -> EngineStats:
    base = dict(
        num_running=0,
        num_waiting=0,
        num_kv_blocks_total=100,
        num_kv_blocks_used=0,
        num_kv_blocks_free=100,
        prefix_cache_queries=0,
        prefix_cache_hits=0,
        num_preemptions=0,
        num_generated_tokens=0,
    )
    return EngineStats(**{**base, **overrides})


def heartbeat(client, consumer="w1", interval_s=0.2, **kw) -> Heartbeat:
    return Heartbeat(
        client,
        K,
        consumer=consumer,
        model="tiny",
        group="tiny",
        streams=[K.requests],
        max_model_len=256,
        capacity=8,
        interval_s=interval_s,
        **kw,
    )


def test_members_without_a_record_or_with_a_bad_one_are_lost():
    record = heartbeat(None).record.model_dump_json()
    found = registry.members([(b"a", 1.0), (b"b", 2.0), ("c", 3.0)], [record, None, b"{not json"])
    assert [m.lost for m in found] == [False, True, True]
    assert [m.consumer for m in found] == ["a", "b", "c"] and found[1].last_heartbeat_ms == 2
    assert [r.consumer for r in registry.live(found)] == ["w1"]


def test_unknown_fields_are_kept_for_newer_workers():
    raw = heartbeat(None).record.model_dump() | {"something_new": 7}
    record = registry.WorkerRecord.model_validate(raw)
    assert record.model_dump()["something_new"] == 7


def test_rates_come_from_the_engine_counters_and_read_zero_when_idle():
    hb = heartbeat(None)
    hb.update(stats(num_generated_tokens=0, prefix_cache_queries=0), 0, stepped=True)
    hb._rate_base = (hb._rate_base[0] - 2.0, 0, 0)  # the first numbers were taken 2 s ago
    hb.update(
        stats(num_running=3, num_generated_tokens=100, prefix_cache_queries=500, prefix_cache_hits=100),
        0,
        True,
    )
    assert hb.record.running == 3
    assert hb.record.tokens_out_per_s == pytest.approx(50, rel=0.05)
    assert hb.record.tokens_in_per_s == pytest.approx(200, rel=0.05)
    assert (hb.record.prefix_cache_queries, hb.record.prefix_cache_hits) == (500, 100)
    hb.record = hb.record.model_copy(update={"last_step_ms": hb.record.last_step_ms - 10_000})

    class Pipe:  # beat() with the writes discarded: only the record's rates are looked at here
        def __getattr__(self, name):
            return lambda *a, **k: None

    class Client:
        def pipeline(self, transaction):
            return Pipe()

    hb.client = Client()
    hb.beat()
    assert hb.record.tokens_out_per_s == 0 and hb.record.tokens_in_per_s == 0


def test_each_beat_shows_the_running_and_waiting_jobs_and_kv_use_the_loop_saw_last():
    # update() comes about once a second; peers steal by running/waiting (home_watch.py), so the loop's
    # frequent load() is what the next beat writes, and whichever of the two came last wins.
    class Client:
        def pipeline(self, transaction):
            return type("Pipe", (), {"__getattr__": lambda self, name: lambda *a, **k: None})()

    hb = heartbeat(Client())
    hb.update(stats(num_running=3, num_kv_blocks_used=5), 9, stepped=True)
    hb.load(stats(num_running=8, num_waiting=2, num_kv_blocks_used=40), 0)
    shown = lambda: (hb.record.running, hb.record.waiting, hb.record.kv_blocks_used, hb.record.room)  # noqa: E731
    assert shown() == (3, 0, 5, 9)  # not before the beat
    hb.beat()
    assert shown() == (8, 2, 40, 0)
    hb.update(stats(num_running=0, num_kv_blocks_used=0), 16, stepped=True)
    hb.beat()
    assert shown() == (0, 0, 0, 16)


def test_a_worker_is_full_when_it_has_no_room_even_with_free_slots():
    # Peers steal its shards' jobs by this (home_watch.py): a pool out of KV blocks starts nothing, though
    # its running jobs are fewer than its capacity and none waits.
    record = heartbeat(None).record
    kv_bound = record.model_copy(update={"running": 5, "waiting": 0, "room": 0})
    assert record.capacity > 5 and kv_bound.full
    assert not record.model_copy(update={"running": 5, "room": 3}).full
    # A record from a worker without the field: judged by slots and waiting jobs.
    old = registry.WorkerRecord.model_validate({k: v for k, v in record.model_dump().items() if k != "room"})
    assert old.room is None and not old.full
    assert old.model_copy(update={"waiting": 1}).full
    assert old.model_copy(update={"running": record.capacity}).full


def test_jobs_per_second_and_the_latest_ttfts_ride_in_the_record():
    hb = heartbeat(None)
    hb.update(stats(), 0, stepped=True)
    hb._rate_base = (hb._rate_base[0] - 2.0, 0, 0)
    for k in range(70):
        hb.first_token(100.4 + k)
    for _ in range(3):
        hb.job_finished()
    hb.update(stats(), 0, stepped=True)
    assert hb.record.jobs_per_s == pytest.approx(1.5, rel=0.05)
    assert hb.record.ttft_ms_recent == [100 + k for k in range(6, 70)]  # the newest 64, rounded
    round_trip = registry.WorkerRecord.model_validate_json(hb.record.model_dump_json())
    assert round_trip.ttft_ms_recent == hb.record.ttft_ms_recent


@pytest.mark.redis
def test_a_live_record_lapses_into_lost_and_a_clean_stop_leaves(redis_server, r):
    a, b = heartbeat(r, "a"), heartbeat(r, "b")
    a.start()
    b.start()
    try:
        found = wait_until(lambda: [m for m in registry.read(r, K) if not m.lost], 5, "two live workers")
        assert sorted(m.consumer for m in found) == ["a", "b"]
        assert r.pttl(K.worker("a")) <= a.ttl_ms
        beat_before = registry.live(registry.read(r, K))[0].heartbeat_ms
        wait_until(lambda: registry.live(registry.read(r, K))[0].heartbeat_ms > beat_before, 5, "a new beat")
        a.stop(remove=False)  # as if killed: no more beats, nothing removed
        b.stop()  # a clean stop
        assert [m.consumer for m in registry.read(r, K)] == ["a"], "b left the registry"
        start = time.monotonic()
        wait_until(lambda: registry.read(r, K)[0].lost, 5, "a shown as lost")
        assert time.monotonic() - start <= a.ttl_ms / 1000 + 0.5
    finally:
        a.stop(remove=True)
        b.stop()
    assert registry.read(r, K) == []


@pytest.mark.redis
def test_a_worker_refused_its_name_never_touches_the_live_record(redis_server, r):
    hb = heartbeat(r, "never-started")
    hb.stop()  # stop without start: nothing written, nothing deleted
    assert r.exists(K.worker("never-started")) == 0 and r.zcard(K.workers) == 0


@pytest.mark.redis
@pytest.mark.timeout(180)
def test_a_worker_process_shows_within_one_beat_and_is_lost_one_ttl_after_kill_9(
    redis_server, r, tiny_model, tmp_path
):
    proc = spawn_worker(
        redis_server.url, tiny_model, "beating", tmp_path / "w.log", "--registry-interval", "0.5"
    )
    try:
        record = wait_until(lambda: registry.live(registry.read(r, K)), 90, "the worker's record")[0]
        assert (record.consumer, record.group, record.streams) == ("beating", "test", [K.requests])
        assert record.capacity == 16 and record.max_model_len > 0 and record.kv_blocks_total > 0
        assert record.pid == proc.pid and not record.draining and record.ttl_ms == 1500
        enqueue(
            r, {"id": "j1", "prompt": "hello there", "max_tokens": 40, "ignore_eos": True, "temperature": 0}
        )
        assert collect(r, "j1", timeout_s=60)[-1]["type"] == "done"
        stepped = wait_until(lambda: registry.live(registry.read(r, K))[0].last_step_ms, 5, "a step time")
        assert stepped >= record.started_ms
        wait_until(lambda: registry.live(registry.read(r, K))[0].running == 0, 5, "running back to 0")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        killed = time.monotonic()
        wait_until(lambda: registry.read(r, K)[0].lost, 5, "the killed worker shown as lost")
        assert time.monotonic() - killed <= 1.5 + 0.5  # one TTL (3 beats of 0.5 s), plus polling slack
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.redis
def test_a_heartbeat_refused_by_a_full_redis_is_retried_and_never_fatal(own_server):
    """docs/operations.md: a full Redis is survived. The first beat (a worker starting on a full server)
    raised OutOfMemoryError out of the worker's start; now it is logged once and retried with backoff."""
    import structlog

    from tests.worker.recover.test_redis_failures import make_full
    from worker.connection import connect

    server = own_server("--maxmemory", "64mb", "--maxmemory-policy", "noeviction")
    r = connect(server.url)
    make_full(r)
    beat = heartbeat(r, "full", interval_s=0.5)
    with structlog.testing.capture_logs() as logs:
        beat.start()  # returns: the worker goes on to serve
        try:
            time.sleep(0.6)
            assert not r.exists(K.worker("full"))
            r.config_set("maxmemory", "64mb")
            wait_until(lambda: r.exists(K.worker("full")), 5, "the record once there is room")
        finally:
            beat.stop()
    said = [entry["event"] for entry in logs]
    assert said.count("registry heartbeat failed, retrying") == 1  # one line per outage, not per try
    assert "registry heartbeat written again" in said

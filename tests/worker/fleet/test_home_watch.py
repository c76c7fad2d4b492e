"""HomeWatch (worker/fleet/home_watch.py): a worker's home shards follow the live workers in the registry,
a dead worker's shards move within one TTL plus one interval, and what it reads is counted."""

from __future__ import annotations

import time

import pytest

from tests.helpers.waiting import wait_until
from worker.fleet.heartbeat import Heartbeat
from worker.fleet.home_shards import home_shards
from worker.fleet.home_watch import HomeWatch
from worker.intake.home_first import HomeFirst
from worker.keys import Keys
from worker.run.metrics import Metrics

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]
K = Keys()
SHARDS = 12
STREAMS = [f"conveyor:{{s{k}}}:requests" for k in range(SHARDS)]


def beat(client, consumer: str, group: str = "tiny", interval_s: float = 0.2) -> Heartbeat:
    hb = Heartbeat(
        client,
        K,
        consumer=consumer,
        model="tiny",
        group=group,
        streams=STREAMS,
        max_model_len=256,
        capacity=8,
        interval_s=interval_s,
    )
    hb.start()
    return hb


def watch(client, metrics: Metrics | None = None, heartbeat: Heartbeat | None = None) -> HomeWatch:
    policy = HomeFirst(SHARDS, set(range(SHARDS)))
    return HomeWatch(
        client,
        K,
        policy,
        consumer="a",
        group="tiny",
        streams=STREAMS,
        interval_s=0.05,
        metrics=metrics,
        heartbeat=heartbeat,
    )


def value(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, {"consumer": "a", **labels})


def test_home_follows_joins_and_clean_leaves_and_ignores_other_groups(r):
    metrics = Metrics({"consumer": "a"})
    a = beat(r, "a")
    b = beat(r, "b")
    other = beat(r, "x", group="another-model")
    w = watch(r, metrics, heartbeat=a)
    try:
        w()
        assert w.peers == ["a", "b"]
        assert w.policy.home == home_shards(SHARDS, ["a", "b"])["a"]
        assert value(metrics, "conveyor_home_shards") == len(w.policy.home)
        assert value(metrics, "conveyor_shard_ownership_changes_total") == 0  # the first set is no change
        c = beat(r, "c")
        time.sleep(0.06)
        w()
        mine = home_shards(SHARDS, ["a", "b", "c"])["a"]
        assert w.policy.home == mine and a.record.home_shards == sorted(mine)
        c.stop()  # a clean stop leaves the registry at once
        b.stop()
        time.sleep(0.06)
        w()
        assert w.peers == ["a"] and w.policy.home == set(range(SHARDS))
        assert value(metrics, "conveyor_shard_ownership_changes_total") == 2
    finally:
        for hb in (a, b, other):
            hb.stop()


def test_a_dead_workers_shards_move_within_one_ttl_and_one_interval(r):
    a, b = beat(r, "a"), beat(r, "b")
    w = watch(r)
    try:
        w()
        assert w.policy.home == home_shards(SHARDS, ["a", "b"])["a"] != set(range(SHARDS))
        b.stop(remove=False)  # killed: no more beats, its record lapses after its TTL
        died = time.monotonic()

        def moved() -> bool:
            w()
            return w.policy.home == set(range(SHARDS))

        wait_until(moved, 5, "the dead worker's shards to move", interval_s=0.02)
        assert time.monotonic() - died <= b.ttl_ms / 1000 + w.interval_s + 0.5
    finally:
        a.stop()
        b.stop()


def test_draining_workers_give_their_shards_away_and_reads_are_counted(r):
    metrics = Metrics({"consumer": "a"})
    b = beat(r, "b")
    w = watch(r, metrics)
    try:
        w()
        theirs = home_shards(SHARDS, ["a", "b"])["b"]
        assert w.policy.home == set(range(SHARDS)) - theirs
        b.draining = lambda: True
        b.beat()
        stolen = min(theirs)
        w.policy.read_back(stolen, asked=4, got=3)  # read before b's shards moved: stolen
        time.sleep(0.06)
        w()
        assert w.policy.home == set(range(SHARDS))
        w.policy.read_back(stolen, asked=4, got=2)  # home now
        time.sleep(0.06)
        w()
        assert value(metrics, "conveyor_jobs_read_total", source="stolen") == 3
        assert value(metrics, "conveyor_jobs_read_total", source="home") == 2
    finally:
        b.stop()


def test_the_shards_of_a_peer_without_room_are_stealable(r):
    from engine.outputs import EngineStats

    b = beat(r, "b")
    w = watch(r)
    try:
        w()
        assert w.policy.stealable == set()  # b has room: its shards are b's to read
        b.update(EngineStats(3, 0, 100, 0, 100, 0, 0, 0, 0), 5, stepped=True)  # 3 of 8 running: room
        b.beat()
        time.sleep(0.06)
        w()
        assert w.policy.stealable == set()
        # Still 3 of 8 slots taken and none waiting, but its KV blocks are spent: it starts nothing.
        b.update(EngineStats(3, 0, 100, 0, 100, 0, 0, 0, 0), 0, stepped=True)
        b.beat()
        time.sleep(0.06)
        w()
        assert w.policy.stealable == home_shards(SHARDS, ["a", "b"])["b"]
        b.update(EngineStats(3, 0, 100, 0, 100, 0, 0, 0, 0), 2, stepped=True)  # room again
        b.beat()
        time.sleep(0.06)
        w()
        assert w.policy.stealable == set()
    finally:
        b.stop()


def test_what_a_peer_has_queued_past_its_room_is_stealable(r):
    # Its record shows room for 2; what its shards hold past that would wait for it.
    from engine.outputs import EngineStats

    b = beat(r, "b")
    w = watch(r)
    theirs = sorted(home_shards(SHARDS, ["a", "b"])["b"])
    for k in theirs:
        r.xgroup_create(STREAMS[k], "tiny", id="0", mkstream=True)
    try:
        b.update(EngineStats(3, 0, 100, 0, 100, 0, 0, 0, 0), 2, stepped=True)
        b.beat()
        r.xadd(STREAMS[theirs[0]], {"job": "{}"})
        r.xadd(STREAMS[theirs[-1]], {"job": "{}"})
        w()
        assert w.policy.stealable == set()  # 2 queued, room for 2
        r.xadd(STREAMS[theirs[0]], {"job": "{}"})
        time.sleep(0.06)
        w()
        # One past its room: one may be stolen, from the shard with the most queued.
        assert w.policy.stealable == {theirs[0]} and w.policy.steal_left == {theirs[0]: 1}
        r.xreadgroup("tiny", "b", {STREAMS[k]: ">" for k in theirs})  # b takes them
        time.sleep(0.06)
        w()
        assert w.policy.stealable == set()
    finally:
        b.stop()

"""Workers with prefix affinity on a sharded Redis (`--affinity`, worker/fleet/home_watch.py): jobs routed
by key run exactly once; a worker whose home shards have work does not steal, one whose home shards are
empty does; a killed worker's job is resumed exactly and its shards move to the survivor within a lease."""

from __future__ import annotations

import json
import signal
import time
from contextlib import ExitStack, contextmanager

import pytest

from engine.outputs import EngineStats
from tests.helpers.waiting import wait_until
from tests.helpers.worker_fakes import RecordingEngine, on_a_thread, real_engine, spawn_worker
from worker.cluster.shard_keys import ShardedKeys
from worker.config import WorkerConfig
from worker.connection import connect
from worker.fleet import registry
from worker.fleet.heartbeat import Heartbeat
from worker.fleet.home_shards import home_shards
from worker.fleet.home_watch import use_home_shards
from worker.job_queue import ShardedQueue
from worker.keys import Keys
from worker.run.build import build
from worker.run.loop import Worker
from worker.shard_choice import choose_shard

pytestmark = [pytest.mark.redis, pytest.mark.timeout(180)]
SHARDS = 6
STREAMS = [k.requests for k in ShardedKeys("conveyor", SHARDS).all()]


def stats(running: int) -> EngineStats:
    return EngineStats(running, 0, 100, 0, 100, 0, 0, 0, 0)


def heartbeat(client, consumer: str, capacity: int = 4) -> Heartbeat:
    return Heartbeat(
        client,
        Keys(),
        consumer=consumer,
        model="fake",
        group="test",
        streams=STREAMS,
        max_model_len=512,
        capacity=capacity,
        interval_s=0.2,
    )


def affinity_worker(url: str, engine, consumer: str) -> Worker:
    cfg = WorkerConfig(
        group="test", consumer=consumer, lease_ms=3000, shards=SHARDS, affinity=True, registry_interval_s=0.2
    )
    client = connect(url)
    w = build(engine, client, cfg)
    w.observer.heartbeat = heartbeat(client, consumer, engine.max_num_seqs)
    use_home_shards(w, client, cfg, w.observer.heartbeat)
    return w


@contextmanager
def running(w: Worker):
    """On a thread, drained on exit, then out of the registry (as `conveyor worker` leaves it)."""
    try:
        with on_a_thread(w):
            yield w
    finally:
        w.observer.heartbeat.stop()


def count_ticks(w: Worker) -> list[float]:
    """The times of `w`'s cycles from now on (Worker.tick wrapped)."""
    ticks: list[float] = []
    tick = w.tick

    def counted() -> None:
        ticks.append(time.monotonic())
        tick()

    w.tick = counted
    return ticks


def events(r, job_id: str, shard: int) -> list[dict]:
    out = ShardedKeys("conveyor", SHARDS).shard(shard).out(job_id)
    return [json.loads(f[b"event"]) for _, f in r.xrange(out)]


def done(r, job_id: str, shard: int) -> bool:
    return any(e["type"] == "done" for e in events(r, job_id, shard))


def key_on(shard: int, start: int = 0) -> str:
    """An affinity key that routes to `shard`."""
    i = start
    while choose_shard({"id": "x", "affinity": f"key-{i}"}, SHARDS) != shard:
        i += 1
    return f"key-{i}"


def test_jobs_routed_by_key_run_exactly_once_and_homes_split_the_shards(redis_server, r):
    queue = ShardedQueue(r, ShardedKeys("conveyor", SHARDS))
    engines = [RecordingEngine(max_num_seqs=4, step_s=0.003) for _ in range(2)]
    workers = [affinity_worker(redis_server.url, e, f"w{i}") for i, e in enumerate(engines)]
    placed: dict[str, int] = {}
    with ExitStack() as stack:
        for w in workers:
            stack.enter_context(running(w))
        wait_until(lambda: all(w.policy.home != set(range(SHARDS)) for w in workers), 20, "homes split")
        for i in range(48):
            doc = f"Document {i % 12}. " + "shared words " * 30  # 12 prefixes, 4 jobs each
            placed[f"j{i}"] = queue.submit({"id": f"j{i}", "prompt": doc + f"q{i}", "max_tokens": 5})
        for job_id, shard in placed.items():
            wait_until(lambda j=job_id, s=shard: done(r, j, s), 60, f"{job_id} done")
        homes = [w.policy.home for w in workers]
        read = [w.policy.from_home + w.policy.stolen for w in workers]
    assert homes == [home_shards(SHARDS, ["w0", "w1"])[f"w{i}"] for i in range(2)]
    assert sorted(engines[0].added + engines[1].added) == sorted(placed)  # each job run exactly once
    assert sum(read) == 48
    for job_id, shard in placed.items():
        kinds = [e["type"] for e in events(r, job_id, shard)]
        assert kinds.count("done") == 1 and kinds[-1] == "done"
    keyed = {json.loads(f[b"job"])["affinity"] for k in range(SHARDS) for _, f in r.xrange(STREAMS[k])}
    assert len(keyed) == 12  # the jobs of one prefix share a key (and so a shard)
    for k in range(SHARDS):
        group = r.xinfo_groups(STREAMS[k])[0]
        assert group["pending"] == 0 and group["lag"] == 0


@pytest.mark.parametrize("max_num_seqs", [1, 12])
def test_home_work_first_then_stealing_from_a_peer_that_does_not_read(redis_server, r, max_num_seqs):
    """A registered peer that never reads owns half the shards: this worker runs every job of its own
    shards first (no stealing while home has work), leaves the peer's alone while the peer has room, and
    takes them once the peer's record says it is full (stealing). With room for 12 jobs over 6 shards an
    idle wait reads every lane at once (intake/joint_wait.py): the peer's lanes must be left out of it."""
    ghost = heartbeat(r, "ghost", capacity=16)  # room for all 9 of its jobs: none would wait
    ghost.start()
    try:
        mine = home_shards(SHARDS, ["ghost", "w1"])["w1"]
        theirs = set(range(SHARDS)) - mine
        assert mine and theirs
        queue = ShardedQueue(r, ShardedKeys("conveyor", SHARDS))
        jobs: dict[str, int] = {}
        for k in sorted(theirs) + sorted(mine):  # the peer's jobs queued first
            for j in range(3):
                job_id = f"s{k}-{j}"
                job = {"id": job_id, "prompt": "p", "affinity": key_on(k), "max_tokens": 3}
                jobs[job_id] = queue.submit(job)
                assert jobs[job_id] == k
        engine = RecordingEngine(max_num_seqs=max_num_seqs, step_s=0.003)
        w = affinity_worker(redis_server.url, engine, "w1")
        ticks = count_ticks(w)
        with running(w):
            for job_id, shard in jobs.items():
                if shard in mine:
                    wait_until(lambda j=job_id, s=shard: done(r, j, s), 60, f"{job_id} done")
            idle_from = len(ticks)
            time.sleep(1.0)  # the peer has room (its record): its shards are its own to read
            assert all(r.xinfo_groups(STREAMS[k])[0]["lag"] == 3 for k in theirs)
            # Idle, it blocks on its own lanes (a registry interval each wait), not polling the peer's
            # lanes in rounds that do not block (a round trip each, hundreds a second) for jobs it must
            # not take.
            assert w.idle_block_ms == 200
            assert len(ticks) - idle_from <= 1.0 / 0.2 + 5
            ghost.update(stats(running=ghost.record.capacity), 0, stepped=True)  # the peer is full now
            ghost.beat()
            for job_id, shard in jobs.items():
                wait_until(lambda j=job_id, s=shard: done(r, j, s), 60, f"{job_id} done")
            stolen, from_home = w.policy.stolen, w.policy.from_home
    finally:
        ghost.stop()
    order = [jobs[job_id] in mine for job_id in engine.added]
    assert order == [True] * (3 * len(mine)) + [False] * (3 * len(theirs))
    assert (from_home, stolen) == (3 * len(mine), 3 * len(theirs))


@pytest.mark.timeout(400)  # two model loads and a reference run on a loaded 2-core machine
def test_killed_worker_job_resumed_exactly_and_its_shards_move_within_a_lease(
    redis_server, r, tiny_model, tmp_path
):
    """Two `conveyor worker --shards S --affinity` processes; the one running a job is killed (-9): the
    other resumes it exactly where it stopped and owns every shard within one lease."""
    from engine import SamplingParams
    from worker.client import collect

    lease_ms = 4000
    args = ("--shards", str(SHARDS), "--affinity", "--lease-ms", str(lease_ms), "--registry-interval", "0.5")
    queue = ShardedQueue(r, ShardedKeys("conveyor", SHARDS))
    job = {"id": "rz", "prompt": "resume across workers", "max_tokens": 300, "ignore_eos": True}
    job["temperature"] = 0
    procs = {
        name: spawn_worker(redis_server.url, tiny_model, name, tmp_path / f"{name}.log", *args)
        for name in ("first", "second")
    }
    homes = home_shards(SHARDS, list(procs))

    def record(name: str):
        return {m.consumer: m.record for m in registry.read(r, Keys())}.get(name)

    def home_of(name: str) -> list[int] | None:
        found = record(name)
        return None if found is None else found.home_shards

    try:
        for name in procs:
            wait_until(lambda n=name: home_of(n) == sorted(homes[n]), 180, f"{name}'s home shards")
        shard = queue.submit(job)
        keys = queue.keys(shard)
        wait_until(lambda: r.xlen(keys.out("rz")) >= 5, 90, "first tokens")
        owner = r.get(keys.owner("rz")).decode()
        survivor = next(name for name in procs if name != owner)
        procs[owner].send_signal(signal.SIGKILL)
        procs[owner].wait(timeout=30)
        killed = time.monotonic()
        assert r.xlen(keys.out("rz")) < 301, "the job should not have finished before the kill"
        wait_until(lambda: home_of(survivor) == list(range(SHARDS)), 30, f"{survivor} owns every shard")
        assert time.monotonic() - killed <= lease_ms / 1000 + 1.0  # within one lease (+ slack)
        found = collect(r, "rz", keys, timeout_s=120)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=30)
    indices = [e["index"] for e in found if e["type"] == "token"]
    assert indices == list(range(300)) and [e["type"] for e in found].count("done") == 1
    tokens = [t for e in found if e["type"] == "token" for t in e["token_ids"]]
    direct = real_engine(tiny_model).generate(
        [job["prompt"]], SamplingParams(max_tokens=300, ignore_eos=True, temperature=0)
    )
    assert tokens == direct[0].token_ids
    assert r.xinfo_groups(keys.requests)[0]["pending"] == 0

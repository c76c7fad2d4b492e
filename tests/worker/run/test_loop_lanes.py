"""The one loop over several lanes on one Redis (run/loop.py): protocol version 2's shards without a cluster
(run/build.py), split streams (a lane per priority level), and a read policy changed while it runs."""

from __future__ import annotations

import signal

import pytest
import structlog

from tests.helpers.waiting import wait_until
from tests.helpers.worker_fakes import FakeEngine, RecordingEngine, on_a_thread, real_engine, spawn_worker
from worker.cluster.shard_keys import ShardedKeys
from worker.config import WorkerConfig
from worker.connection import connect
from worker.intake.lanes import split_stream
from worker.intake.priority_lanes import PriorityLanes
from worker.intake.read_policy import ReadPolicy
from worker.job_queue import ShardedQueue
from worker.keys import Keys
from worker.run.build import build
from worker.run.loop import Layout, Worker

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]

SHARDS = 4


def _cfg(consumer: str, **overrides) -> WorkerConfig:
    return WorkerConfig(
        **{"group": "test", "consumer": consumer, "lease_ms": 3000, "shards": SHARDS, **overrides}
    )


def test_two_workers_on_a_sharded_redis_run_each_job_once(redis_server, r):
    queue = ShardedQueue(r, ShardedKeys("conveyor", SHARDS))
    engines = [RecordingEngine(max_num_seqs=4, step_s=0.003) for _ in range(2)]
    placed: dict[str, int] = {}
    with (
        on_a_thread(build(engines[0], connect(redis_server.url), _cfg("w1"))),
        on_a_thread(build(engines[1], connect(redis_server.url), _cfg("w2"))),
    ):
        for i in range(40):
            placed[f"j{i}"] = queue.submit({"id": f"j{i}", "prompt": f"q{i}", "max_tokens": 6, "seed": i})
        for job_id, shard in placed.items():
            wait_until(lambda j=job_id, s=shard: _done(r, queue, j, s), 60, f"{job_id} done")
    assert len(set(placed.values())) == SHARDS  # the jobs spread over every shard
    ran = engines[0].added + engines[1].added
    assert sorted(ran) == sorted(placed)  # each job added to an engine exactly once
    for job_id, shard in placed.items():
        events = _events(r, queue, job_id, shard)
        i = int(job_id[1:])
        assert [e["index"] for e in events if e["type"] == "token"] == list(range(6)), job_id
        assert [e["type"] for e in events].count("done") == 1 and events[-1]["type"] == "done"
        assert events[-1]["text"] == engines[0].expected_text(f"q{i}", 6, seed=i)
    for k in range(SHARDS):
        group = r.xinfo_groups(queue.keys(k).requests)[0]
        assert group["pending"] == 0 and group["lag"] == 0  # every entry read and acknowledged


def _events(r, queue, job_id: str, shard: int) -> list[dict]:
    import json

    return [json.loads(f[b"event"]) for _, f in r.xrange(queue.keys(shard).out(job_id))]


def _done(r, queue, job_id: str, shard: int) -> bool:
    return any(e["type"] == "done" for e in _events(r, queue, job_id, shard))


def test_an_idle_worker_on_one_redis_wakes_for_any_shard(redis_server, r):
    """Idle on every shard of one Redis, a worker waits in one XREADGROUP over all the shard streams
    (intake/joint_wait.py), so a job on any shard wakes it. Blocking on each shard in turn for
    block_ms / shards (6 s each here) would leave a job on another shard waiting for its turn."""
    from tests.helpers.worker_fakes import blocked_clients
    from worker.client import collect

    queue = ShardedQueue(r, ShardedKeys("conveyor", SHARDS))
    cfg = _cfg("w1", block_ms=6000 * SHARDS, lease_ms=120_000)  # (heartbeats would end an idle wait)
    with on_a_thread(build(FakeEngine(step_s=0.001), connect(redis_server.url), cfg)):
        for k in [3, 1, 2, 0]:  # (not the order an idle worker's turns would go round in)
            job_id = next(f"w{i}" for i in range(1000) if _shard(f"w{i}") == k)
            wait_until(lambda: blocked_clients(r) == 1, 30, "the worker blocked, idle")
            # Token ids: no default affinity key, so the job goes to its shard by id (shard_choice.py).
            shard = queue.submit({"id": job_id, "prompt_token_ids": [5, 6], "max_tokens": 2})
            assert shard == k
            assert collect(r, job_id, queue.keys(shard), timeout_s=3)[-1]["type"] == "done"


def _shard(job_id: str) -> int:
    from worker.shard_choice import choose_shard

    return choose_shard({"id": job_id}, SHARDS)


def test_an_idle_worker_takes_over_a_dead_consumer_s_jobs_on_every_shard(redis_server, r):
    """An entry left pending by a consumer that died is claimed once its lease lapses, on each shard of
    one Redis in turn, by a worker otherwise idle (claims need room, which the lane leading a cycle has:
    every lane must lead in turn, idle cycles included)."""
    import json

    from worker.client import collect
    from worker.keys import JOB_FIELD

    sharded = ShardedKeys("conveyor", SHARDS)
    for keys in sharded.all():
        r.xgroup_create(keys.requests, "test", id="0", mkstream=True)
    cfg = _cfg("w1", lease_ms=1000)
    with on_a_thread(build(FakeEngine(step_s=0.001), connect(redis_server.url), cfg)):
        for k in [2, 0, 3, 1, 2, 0]:
            keys, job_id = sharded.shard(k), f"d{k}-{r.incr('n')}"
            r.xadd(keys.requests, {JOB_FIELD: json.dumps({"id": job_id, "prompt": "p", "max_tokens": 3})})
            r.xreadgroup("test", "dead", {keys.requests: ">"}, count=1)  # pending under a consumer gone
            assert collect(r, job_id, keys, timeout_s=20)[-1]["type"] == "done"
            assert r.xpending(keys.requests, "test")["pending"] == 0


def test_takeover_after_kill_9_on_a_sharded_redis(redis_server, r, tiny_model, tmp_path):
    """`conveyor worker --shards S` without --cluster: a second worker resumes a killed one's job on its
    shard of one Redis, exactly where it stopped (the tokens equal an uninterrupted run's)."""
    from engine import SamplingParams
    from worker.client import collect

    job = {"id": "rz", "prompt": "resume across workers", "max_tokens": 150, "ignore_eos": True}
    job["temperature"] = 0
    queue = ShardedQueue(r, ShardedKeys("conveyor", SHARDS))
    args = ("--shards", str(SHARDS), "--lease-ms", "1000")
    first = spawn_worker(redis_server.url, tiny_model, "first", tmp_path / "1.log", *args)
    try:
        shard = queue.submit(job)
        keys = queue.keys(shard)
        wait_until(lambda: r.xlen(keys.out("rz")) >= 5, 90, "first tokens")
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert r.xlen(keys.out("rz")) < 151, "the job should not have finished before the kill"
    second = spawn_worker(redis_server.url, tiny_model, "second", tmp_path / "2.log", *args)
    try:
        events = collect(r, "rz", keys, timeout_s=90)
    finally:
        second.terminate()
        second.wait(timeout=30)
    indices = [e["index"] for e in events if e["type"] == "token"]
    assert indices == list(range(150)) and [e["type"] for e in events].count("done") == 1
    tokens = [t for e in events if e["type"] == "token" for t in e["token_ids"]]
    direct = real_engine(tiny_model).generate(
        [job["prompt"]], SamplingParams(max_tokens=150, ignore_eos=True, temperature=0)
    )
    assert tokens == direct[0].token_ids
    assert r.xinfo_groups(keys.requests)[0]["pending"] == 0


def _split_worker(url: str, engine, policy: ReadPolicy, consumer: str = "w1") -> Worker:
    lanes = split_stream(Keys(), "test", ["p0", "p1"])
    cfg = WorkerConfig(group="test", consumer=consumer, lease_ms=3000)
    client = connect(url)
    return Worker(engine, client, cfg, layout=Layout(lanes, [client] * len(lanes), policy))


def test_split_stream_lanes_run_through_one_worker(redis_server, r):
    """A lane per priority level, the jobs' keys shared: every job of both lanes runs once under one
    consumer name, whose lease both lanes hold; the level-0 job, queued last, starts first. (That the
    worker reads what the policy shares is shown by the next test.)"""
    from worker.client import collect, enqueue

    lanes = split_stream(Keys(), "test", ["p0", "p1"])
    for i in range(8):
        enqueue(r, {"id": f"low{i}", "prompt": f"l{i}", "max_tokens": 4}, lanes[1].keys)
    enqueue(r, {"id": "high", "prompt": "h", "max_tokens": 4}, lanes[0].keys)
    engine = RecordingEngine(max_num_seqs=2, step_s=0.003)
    with (
        structlog.testing.capture_logs() as logs,
        on_a_thread(_split_worker(redis_server.url, engine, PriorityLanes(2))),
    ):
        for job_id in ["high", *(f"low{i}" for i in range(8))]:
            assert collect(r, job_id, Keys(), timeout_s=30)[-1]["type"] == "done"
        assert r.get("conveyor:consumer:test:w1") is not None  # one lease, held by both lanes
    # The lanes share the consumer name's lease: neither waits for, nor takes over, the other's.
    assert not [e for e in logs if e["event"].startswith("consumer name")], logs
    assert engine.added[0] == "high"
    assert sorted(engine.added) == sorted(["high", *(f"low{i}" for i in range(8))])
    for lane in lanes:
        assert r.xinfo_groups(lane.stream)[0]["pending"] == 0


class OnlyLane(ReadPolicy):
    """All the room to one lane, which another component may change between ticks."""

    def __init__(self, lanes: int, lane: int) -> None:
        super().__init__(lanes)
        self.lane = lane

    def split(self, room: int, first: int) -> list[int]:
        return [room if k == self.lane else 0 for k in range(self.lanes)]


def test_a_policy_changed_between_ticks_takes_effect(redis_server, r):
    """A hook run on the loop's thread between ticks may change the policy (issue 22's home shards move
    when workers join or leave): while the worker is busy, a lane the policy gives nothing is not read;
    once the policy points there, its job runs."""
    from worker.client import collect, enqueue

    lanes = split_stream(Keys(), "test", ["p0", "p1"])
    policy = OnlyLane(2, lane=0)
    worker = _split_worker(redis_server.url, FakeEngine(step_s=0.005), policy)
    moves: list[int] = []
    worker.between_ticks.append(lambda: moves and setattr(policy, "lane", moves.pop()))
    long_out = Keys().out("long")
    with on_a_thread(worker):
        enqueue(r, {"id": "long", "prompt": "a", "max_tokens": 400}, lanes[0].keys)
        wait_until(lambda: r.xlen(long_out) >= 5, 30, "the long job running")
        enqueue(r, {"id": "b", "prompt": "b", "max_tokens": 3}, lanes[1].keys)
        seen = r.xlen(long_out)
        wait_until(lambda: r.xlen(long_out) >= seen + 30, 30, "30 more steps")
        assert r.xinfo_groups(lanes[1].stream)[0]["lag"] == 1  # lane 1 not read: the policy ignores it
        moves.append(1)
        assert collect(r, "b", Keys(), timeout_s=30)[-1]["type"] == "done"
        assert r.xlen(long_out) < 400  # b ran beside the long job, not after it
    with pytest.raises(ValueError):
        worker.use_policy(OnlyLane(3, lane=0))  # a policy over other lanes than the worker's

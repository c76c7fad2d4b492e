"""Workers in cluster mode against a real 3-master Redis Cluster, with the fake engine."""

from __future__ import annotations

import pytest

from tests.cluster.conftest import SHARDS, sharded_worker
from tests.helpers.worker_fakes import FakeEngine, on_a_thread
from worker.cluster.connect import connect_cluster

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(90)]


def nothing_pending(client) -> bool:
    for k in range(SHARDS):
        keys = client.sharded.shard(k)
        node = client.node(k)
        group = node.xinfo_groups(keys.requests)[0]
        if group["pending"] or group["lag"] or node.hlen(keys.attempts):
            return False
    return True


def test_two_workers_finish_200_jobs_over_8_shards(cluster, client):
    engines = [FakeEngine(max_num_seqs=16), FakeEngine(max_num_seqs=16)]
    with sharded_worker(engines[0], cluster.url, "w1"), sharded_worker(engines[1], cluster.url, "w2"):
        placed = {}
        for i in range(200):
            job = {"id": f"j{i}", "prompt": f"p{i}", "max_tokens": 5, "seed": i}
            placed[job["id"]] = client.submit(job, replicas=1)
        assert set(placed.values()) == set(range(SHARDS))  # every shard got jobs
        for job_id, shard in placed.items():
            events = client.collect(job_id, shard, timeout_s=60)
            i = int(job_id[1:])
            assert [e["index"] for e in events[:-1]] == list(range(5))
            assert events[-1]["type"] == "done"
            assert events[-1]["text"] == engines[0].expected_text(f"p{i}", 5, seed=i)
    assert nothing_pending(client)
    # Both workers took jobs (each read only what its engine had room for).
    assert engines[0].generated > 0 and engines[1].generated > 0


class RecordingEngine(FakeEngine):
    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.started: list[str] = []

    def add_request(self, request_id, prompt, params=None, **kw):
        self.started.append(request_id)
        return super().add_request(request_id, prompt, params, **kw)


def test_no_shard_waits_behind_another_when_room_is_short(cluster, client):
    """Room for one job at a time and three queued on every shard: the shard read first rotates, so the
    first eight jobs started come from (nearly) eight shards, not three from shard 0, then shard 1..."""
    for k in range(SHARDS):
        for i in range(3):
            client.submit({"id": f"s{k}-{i}", "prompt": "x", "max_tokens": 3}, shard=k)
    engine = RecordingEngine(max_num_seqs=1)
    with sharded_worker(engine, cluster.url, "w1"):
        for k in range(SHARDS):
            for i in range(3):
                assert client.collect(f"s{k}-{i}", k, timeout_s=60)[-1]["type"] == "done"
    first = [job_id.split("-")[0] for job_id in engine.started[:SHARDS]]
    assert len(set(first)) >= 6, engine.started
    assert nothing_pending(client)


class CountingEngine(FakeEngine):
    """Records the most requests it ever held at once."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.most = 0

    def add_request(self, request_id, prompt, params=None, **kw):
        result = super().add_request(request_id, prompt, params, **kw)
        self.most = max(self.most, len({s.request_id for s in self.samples}))
        return result


def test_shards_read_together_never_take_more_than_the_engine_has_room_for(cluster, client):
    """Every shard's round of a cycle is built before any is answered: the reads in flight count as taken
    room, so eight shards with queued jobs do not read 8 x the free slots between them."""
    engine = CountingEngine(max_num_seqs=4)
    placed = {}
    for i in range(48):  # all queued before the worker starts: every shard has more than the room
        placed[f"r{i}"] = client.submit(
            {"id": f"r{i}", "prompt": "x", "max_tokens": 2 + i % 7}, shard=i % SHARDS
        )
    with sharded_worker(engine, cluster.url, "w1"):
        for job_id, shard in placed.items():
            assert client.collect(job_id, shard, timeout_s=60)[-1]["type"] == "done"
    assert engine.most <= 4
    assert nothing_pending(client)


def test_a_shard_with_a_backlog_refills_the_engine_at_once(cluster, client):
    """48 jobs queued on one shard, room for 8: when a cohort finishes, that shard (its reads come back
    full) reads the 8 free slots in one round, not 8 / shards of them per step."""
    engine = FakeEngine(max_num_seqs=8)
    for i in range(48):
        client.submit({"id": f"h{i}", "prompt": "x", "max_tokens": 3, "seed": i}, shard=5)
    with sharded_worker(engine, cluster.url, "w1"):
        for i in range(48):
            assert client.collect(f"h{i}", 5, timeout_s=60)[-1]["type"] == "done"
    # Read 8 / shards = 1 job per step, 3-token jobs would keep at most 3 running; a probe of another
    # shard may take one slot of a refill (a cohort of 7 and one of 1 then alternate).
    assert sum(engine.batch_sizes) / len(engine.batch_sizes) >= 6, engine.batch_sizes
    assert nothing_pending(client)


class ShardCountingEngine(FakeEngine):
    """Records, per step with a full batch, how many shards its jobs ("s<k>-<i>") came from."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.shards_per_full_step: list[int] = []

    def step(self):
        running = {s.request_id for s in self.samples}
        if len(running) == self.max_num_seqs:
            self.shards_per_full_step.append(len({job_id.split("-")[0] for job_id in running}))
        return super().step()


def test_a_step_carries_jobs_of_few_shards_while_every_shard_has_a_backlog(cluster, client):
    """Jobs of mixed lengths (the room opens a few at a time) queued on all 8 shards: the room goes to one
    shard's backlog at a time (read_shares.py), so a step writes to few shards (one script call each),
    not to all 8; shared evenly over the hungry shards every refill, a batch soon spans all of them."""
    placed = {}
    for i in range(160):
        placed[f"s{i % SHARDS}-{i}"] = i % SHARDS
    for job_id, shard in placed.items():
        client.submit(
            {"id": job_id, "prompt": "x", "max_tokens": 4 + int(job_id.split("-")[1]) % 9}, shard=shard
        )
    engine = ShardCountingEngine(max_num_seqs=8)
    with sharded_worker(engine, cluster.url, "w1"):
        for job_id, shard in placed.items():
            assert client.collect(job_id, shard, timeout_s=60)[-1]["type"] == "done"
    spans = sorted(engine.shards_per_full_step)
    assert len(spans) > 10 and spans[len(spans) // 2] <= 3, spans
    assert nothing_pending(client)


def test_no_shard_blocks_on_its_stream_while_another_has_work(cluster, client):
    """Jobs on one shard only: while they are read, admitted and run, the 7 idle shards do not block on
    their streams in turn (each such wait is a round trip, and ~100 ms on an empty stream at Redis's
    default hz), they ride along in the cycle's rounds."""
    from worker.config import WorkerConfig
    from worker.run.build import build

    engine = FakeEngine(max_num_seqs=8)
    cfg = WorkerConfig(group="test", consumer="w1", lease_ms=3000, cluster=True, shards=SHARDS)
    worker = build(engine, connect_cluster(cluster.url), cfg)
    blocked_with_work: list[int] = []
    for k, shard_worker in enumerate(worker.lanes):

        def wait(room, arrived, k=k, original=shard_worker.reader.wait):
            if engine.has_unfinished_requests() or any(w.inflight or w.arrived for w in worker.lanes):
                blocked_with_work.append(k)
            return original(room, arrived)

        shard_worker.reader.wait = wait
    for i in range(6):
        client.submit({"id": f"one-{i}", "prompt": "x", "max_tokens": 3}, shard=2)
    with on_a_thread(worker):
        for i in range(6):
            assert client.collect(f"one-{i}", 2, timeout_s=60)[-1]["type"] == "done"
    assert blocked_with_work == []
    assert nothing_pending(client)

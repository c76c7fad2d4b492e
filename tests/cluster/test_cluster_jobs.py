"""Cancel, dead letters and takeover after kill -9 of a worker, in cluster mode (protocol version 2's keys)."""

from __future__ import annotations

import signal

import pytest

from tests.cluster.conftest import sharded_worker
from tests.helpers.waiting import wait_until
from tests.helpers.worker_fakes import FakeEngine, log_lines, real_engine, spawn_worker
from worker.keys import JOB_FIELD

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(120)]


def test_cancel_through_the_shards_channel(cluster, client):
    with sharded_worker(FakeEngine(step_s=0.02), cluster.url, "w1"):
        shard = client.submit({"id": "c1", "prompt": "long", "max_tokens": 400, "seed": 1})
        keys = client.sharded.shard(shard)
        wait_until(lambda: client.node(shard).xlen(keys.out("c1")) >= 3, 30, "first tokens")
        client.cancel("c1", shard)
        events = client.collect("c1", shard, timeout_s=30)
    done = events[-1]
    assert done["type"] == "done" and done["finish_reason"] == "abort" and done["reason"] == "cancel"
    assert len(events) < 400
    group = client.node(shard).xinfo_groups(keys.requests)[0]
    assert group["pending"] == 0 and not client.node(shard).exists(keys.owner("c1"), keys.cancel("c1"))


def test_refused_jobs_go_to_their_shards_dead_letters(cluster, client):
    keys = client.sharded.shard(5)
    node = client.node(5)
    with sharded_worker(FakeEngine(), cluster.url, "w1"):
        node.xadd(keys.requests, {JOB_FIELD: b"not json"})
        client.submit({"id": "bad1", "prompt": "x", "max_tokens": "5"}, shard=5)
        events = client.collect("bad1", 5, timeout_s=30)
        wait_until(lambda: node.xlen(keys.dead) == 2, 30, "two dead letters")
    assert events[-1]["type"] == "error" and events[-1]["code"] == "invalid_job"
    codes = sorted(fields[b"code"] for _, fields in node.xrange(keys.dead))
    assert codes == [b"invalid_job", b"invalid_json"]
    group = node.xinfo_groups(keys.requests)[0]
    assert group["pending"] == 0 and group["lag"] == 0


def test_takeover_after_kill_9_of_a_cluster_worker(cluster, client, tiny_model, tmp_path):
    from engine import SamplingParams

    job = {
        "id": "rz",
        "prompt": "resume across workers",
        "max_tokens": 300,
        "ignore_eos": True,
        "temperature": 0,
    }
    args = ("--cluster", "--shards", str(client.sharded.shards), "--lease-ms", "1000")
    first = spawn_worker(cluster.url, tiny_model, "first", tmp_path / "1.log", *args)
    try:
        shard = client.submit(job, replicas=1)
        keys = client.sharded.shard(shard)
        wait_until(lambda: client.node(shard).xlen(keys.out("rz")) >= 5, 90, "first tokens")
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert client.node(shard).xlen(keys.out("rz")) < 301, "the job should not have finished before the kill"
    second = spawn_worker(cluster.url, tiny_model, "second", tmp_path / "2.log", *args)
    try:
        events = client.collect("rz", shard, timeout_s=90)
    finally:
        second.terminate()
        second.wait(timeout=30)
    indices = [e["index"] for e in events if e["type"] == "token"]
    assert indices == list(range(len(indices))) and [e["type"] for e in events].count("done") == 1
    tokens = [t for e in events if e["type"] == "token" for t in e["token_ids"]]
    direct = real_engine(tiny_model).generate(
        [job["prompt"]], SamplingParams(max_tokens=300, ignore_eos=True, temperature=0)
    )
    assert tokens == direct[0].token_ids and events[-1]["text"] == direct[0].text
    assert any(e.get("event") == "job resumed" for e in log_lines(tmp_path / "2.log"))
    assert client.node(shard).xinfo_groups(keys.requests)[0]["pending"] == 0


def test_the_protocol_docs_redis_cli_example_runs(cluster, client):
    """docs/protocol.md's version 2 example, as written (its port changed), against the cluster."""
    import subprocess
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "protocol.md").read_text()
    block = doc[doc.index("## Version 2") :]
    session = block[block.index("<<'EOF'\n") + len("<<'EOF'\n") : block.index("\nEOF\n")] + "\n"
    port = str(cluster.master_of(client.sharded.shard(0).requests).port)
    with sharded_worker(FakeEngine(), cluster.url, "w1"):
        done = subprocess.run(
            ["redis-cli", "-c", "-p", port], input=session, capture_output=True, text=True, timeout=30
        )
        assert done.returncode == 0 and done.stdout.strip().splitlines()[-1] == "1", done.stdout  # WAIT: 1
        events = client.collect("job-1", 3, timeout_s=30)
    assert [e["index"] for e in events[:-1]] == list(range(16)) and events[-1]["type"] == "done"


def test_live_events_on_sharded_pubsub(cluster, client):
    """SSUBSCRIBE to the job's channel on its shard's master hears every event (a plain PUBLISH would not
    reach a sharded subscriber)."""
    import json

    keys = client.sharded.shard(2)
    pubsub = client.node(2).pubsub()
    pubsub.ssubscribe(keys.out("live1"))
    heard: list[dict] = []
    try:
        pubsub.get_sharded_message(timeout=5)  # the subscription's confirmation
        with sharded_worker(FakeEngine(), cluster.url, "w1"):
            client.submit({"id": "live1", "prompt": "x", "max_tokens": 6, "seed": 2}, shard=2)

            def heard_done() -> bool:
                message = pubsub.get_sharded_message(timeout=0.2)
                if message and message["type"] in ("smessage", b"smessage"):
                    heard.append(json.loads(message["data"]))
                return bool(heard) and heard[-1]["type"] == "done"

            wait_until(heard_done, 30, "the done event on the channel")
    finally:
        pubsub.close()
    assert heard == client.collect("live1", 2, timeout_s=10)

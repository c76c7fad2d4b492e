"""`conveyor batch --cluster` and `conveyor demo --cluster` against the local Redis Cluster."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest
from click.testing import CliRunner

from tests.cluster.conftest import sharded_worker
from tests.helpers.worker_fakes import FakeEngine
from worker.affinity_key import with_affinity
from worker.cli.demo import PROMPTS
from worker.cli.main import main
from worker.cluster.connect import connect_cluster
from worker.shard_choice import choose_shard

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(180)]


def _line(custom_id: str, prompt: str, max_tokens: int) -> str:
    body = {"model": "m", "prompt": prompt, "max_tokens": max_tokens, "seed": 1}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/completions", "body": body})


def test_batch_file_through_two_shards_answers_each_custom_id_once(cluster, client, tmp_path):
    engine = FakeEngine()
    ids = [f"req-{i}" for i in range(12)]
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("".join(_line(c, f"prompt {c}", 4 + i % 3) + "\n" for i, c in enumerate(ids)))
    args = ["batch", "-i", str(inp), "-o", str(out), "--redis-url", cluster.url, "--no-progress"]
    with sharded_worker(engine, cluster.url, "w1", shards=2):
        # --max-in-flight 5: the runner reads from both shards while it still submits.
        run = CliRunner().invoke(
            main, [*args, "--max-in-flight", "5"], env={"CONVEYOR_CLUSTER": "1", "CONVEYOR_SHARDS": "2"}
        )
        assert run.exit_code == 0, run.output
        lines = [json.loads(line) for line in out.read_text().splitlines()]
        assert sorted(line["custom_id"] for line in lines) == sorted(ids)  # each once
        by_id = {line["custom_id"]: line for line in lines}
        for i, custom_id in enumerate(ids):
            response = by_id[custom_id]["response"]
            assert response["status_code"] == 200, by_id[custom_id]
            choice = response["body"]["choices"][0]
            assert choice["text"] == engine.expected_text(f"prompt {custom_id}", 4 + i % 3, seed=1)
        # The jobs went to both shards' request streams.
        placed = [client.node(k).xlen(client.sharded.shard(k).requests) for k in range(2)]
        assert placed[0] > 0 and placed[1] > 0 and sum(placed) == len(ids), placed
        # A rerun finds every line answered and submits nothing.
        again = CliRunner().invoke(main, [*args, "--cluster", "--shards", "2"])
        assert again.exit_code == 0, again.output
        assert "12 answered before" in again.output
        assert sum(client.node(k).xlen(client.sharded.shard(k).requests) for k in range(2)) == len(ids)
    assert len(out.read_text().splitlines()) == len(ids)


def demo_job(k: int) -> dict:
    """The demo's k-th job as the client submits it (keyed by its prompt, worker/affinity_key.py)."""
    return with_affinity({"id": f"demo-{k}", "prompt": PROMPTS[k % len(PROMPTS)]})


def test_demo_on_the_cluster(cluster, client, monkeypatch, tmp_path):
    monkeypatch.setenv("CONVEYOR_CACHE", str(tmp_path / "cache"))
    jobs, shards = 3, 4
    assert len({choose_shard(demo_job(k), shards) for k in range(jobs)}) > 1  # the demo's jobs span shards
    args = ["demo", "--model", "tiny", "--cluster", "--shards", str(shards), "--redis-url", cluster.url]
    run = CliRunner().invoke(main, [*args, "--jobs", str(jobs), "--max-tokens", "6", "--replicas", "1"])
    assert run.exit_code == 0, run.output
    assert "using the Redis Cluster" in run.output
    summary = re.search(r"(\d+) jobs, (\d+) tokens in .* tokens/s through Redis", run.output)
    assert summary is not None and int(summary[1]) == jobs and int(summary[2]) > 0, run.output
    rc = connect_cluster(cluster.url)
    try:
        assert list(rc.scan_iter(match="conveyor-demo-*")) == []  # the demo cleaned up after itself
    finally:
        rc.close()


def test_demo_starts_its_own_cluster_when_none_answers(monkeypatch, tmp_path):
    from worker import local_redis

    if local_redis.redis_server_path() is None:
        pytest.skip("redis-server is not installed")
    from worker.cluster.local_cluster import LocalCluster

    spread: list[list[str]] = []
    original = LocalCluster.spread_shards

    def recording(self, keys):
        original(self, keys)
        spread.append(sorted(self.master_of(key).port for key in keys))

    monkeypatch.setattr(LocalCluster, "spread_shards", recording)
    monkeypatch.setenv("CONVEYOR_CACHE", str(tmp_path / "cache"))
    url = f"redis://127.0.0.1:{local_redis.free_port()}"  # nothing listens there
    run = CliRunner().invoke(
        main, ["demo", "--model", "tiny", "--cluster", "--redis-url", url, "--jobs", "2", "--max-tokens", "4"]
    )
    assert run.exit_code == 0, run.output
    # Its 8 shards were spread 3/3/2 over the 3 masters, not left 2/2/4 as the slot ranges put them.
    assert len(spread) == 1 and sorted(Counter(spread[0]).values()) == [2, 3, 3], spread
    assert "started a local 3-master Redis Cluster" in run.output and "tokens/s through Redis" in run.output

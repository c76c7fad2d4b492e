"""`conveyor worker --cluster` with the real tiny engine, `conveyor submit --cluster`: greedy output equal to
a single-Redis worker's, token for token."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from tests.cluster.conftest import SHARDS
from tests.helpers.worker_fakes import real_engine, running_worker, spawn_worker
from worker import local_redis
from worker.cli.main import main
from worker.client import collect, enqueue
from worker.connection import connect

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(180)]

PROMPTS = [
    f"the {word} of" for word in ("colour", "shape", "end", "first", "river", "sound", "light", "name")
]


def test_cluster_worker_cli_matches_single_redis_greedy(cluster, client, tiny_model, tmp_path):
    jobs = [{"id": f"g{i}", "prompt": p, "max_tokens": 8, "temperature": 0} for i, p in enumerate(PROMPTS)]
    # Reference: the same engine settings behind one plain Redis.
    single = local_redis.start()
    try:
        r = connect(single.url)
        with running_worker(real_engine(tiny_model), single.url):
            for job in jobs:
                enqueue(r, job)
            expected = {job["id"]: collect(r, job["id"], timeout_s=120)[-1]["text"] for job in jobs}
    finally:
        single.stop()
    process = spawn_worker(
        cluster.url, tiny_model, "cli-w", tmp_path / "w.log", "--cluster", "--shards", str(SHARDS)
    )
    try:
        placed = {job["id"]: client.submit(job, replicas=1) for job in jobs[1:]}
        args = ["submit", jobs[0]["prompt"], "--id", "g0", "--max-tokens", "8", "--redis-url", cluster.url]
        run = CliRunner().invoke(main, [*args, "--cluster", "--shards", str(SHARDS), "--timeout", "120"])
        assert run.exit_code == 0, run.output
        assert run.stdout.strip() == expected["g0"].strip()  # the tokens as streamed, then a newline
        for job_id, shard in placed.items():
            assert client.collect(job_id, shard, timeout_s=120)[-1]["text"] == expected[job_id]
    finally:
        process.terminate()
        process.wait(timeout=30)

"""The client examples in other languages, each run against a live worker (real engine, tiny model)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers.worker_fakes import real_engine, running_worker

pytestmark = [pytest.mark.redis, pytest.mark.timeout(180)]
EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def run_example(args, url: str, job_id: str, cwd: Path) -> str:
    env = {**os.environ, "REDIS_URL": url, "JOB_ID": job_id}
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    return done.stdout


def expected(r, job_id: str) -> str:
    import json

    events = [json.loads(f[b"event"]) for _, f in r.xrange(f"conveyor:out:{job_id}")]
    assert events[-1]["type"] == "done"
    return events[-1]["text"]


def test_redis_cli_example(redis_server, r, tiny_model):
    assert shutil.which("redis-cli"), "redis-cli is not installed (Debian: redis-tools, with redis-server)"
    with running_worker(real_engine(tiny_model), redis_server.url):
        out = run_example(
            ["sh", "stream.sh", "Hello from sh", "12"], redis_server.url, "sh1", EXAMPLES / "redis-cli"
        )
    assert '"type":"done"' in out and '"completion_tokens":12' in out


def test_node_example(redis_server, r, tiny_model):
    # A missing tool or a failed `npm ci` (the npm registry is reachable where the tests run) fails.
    assert shutil.which("node") and shutil.which("npm"), "node and npm are not installed"
    node_dir = EXAMPLES / "node"
    if not (node_dir / "node_modules" / "ioredis").exists():
        ci = subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund"],
            cwd=node_dir,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert ci.returncode == 0, f"npm ci failed: {ci.stderr[-600:]}"
    with running_worker(real_engine(tiny_model), redis_server.url):
        out = run_example(["node", "stream.js", "Hello from Node", "12"], redis_server.url, "node1", node_dir)
    assert out == expected(r, "node1") + "\n[done: length, 12 tokens]\n"

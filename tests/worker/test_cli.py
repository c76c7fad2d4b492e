"""The `conveyor` command line: options from the environment, submit, plan, make-tiny-model, demo."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.helpers.worker_fakes import FakeEngine, running_worker
from worker import local_redis
from worker.cli import main

ROOT = Path(__file__).resolve().parents[2]


class _Built(Exception):
    pass


def test_worker_options_come_from_the_environment(monkeypatch):
    import engine

    def fake_engine(model, **kw):
        raise _Built(model, kw)

    monkeypatch.setattr(engine, "LLMEngine", fake_engine, raising=False)
    env = {"CONVEYOR_MODEL": "/some/model", "CONVEYOR_MAX_NUM_SEQS": "7", "CONVEYOR_WORKER_BLOCK_SIZE": "32"}
    result = CliRunner().invoke(main, ["worker", "--no-enable-prefix-caching"], env=env)
    assert isinstance(result.exception, _Built), result.output
    model, kw = result.exception.args
    assert model == "/some/model" and kw["max_num_seqs"] == 7 and kw["block_size"] == 32
    assert kw["enable_prefix_caching"] is False and kw["scheduling"] == "continuous"


@pytest.mark.redis
@pytest.mark.timeout(60)
def test_submit_streams_tokens(redis_server, r):
    engine = FakeEngine()
    with running_worker(engine, redis_server.url):
        result = CliRunner().invoke(
            main,
            [
                "submit",
                "hello",
                "--redis-url",
                redis_server.url,
                "--max-tokens",
                "6",
                "--seed",
                "2",
                "--id",
                "s1",
            ],
        )
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(engine.expected_text("hello", 6, seed=2))


@pytest.mark.timeout(120)
def test_plan_and_make_tiny_model(tiny_model, tmp_path):
    result = CliRunner().invoke(
        main, ["plan", "--model", tiny_model, "--memory", "512MiB", "--max-model-len", "1024"]
    )
    assert (
        result.exit_code == 0 and "KV pool" in result.output and "max_model_len       1024" in result.output
    )
    bad = CliRunner().invoke(main, ["plan", "--model", tiny_model, "--memory", "lots"])
    assert bad.exit_code != 0 and "not a size" in bad.output
    made = CliRunner().invoke(main, ["make-tiny-model", str(tmp_path / "q"), "--arch", "qwen3"])
    assert made.exit_code == 0, made.output
    assert (tmp_path / "q" / "config.json").exists()


@pytest.mark.redis
@pytest.mark.timeout(180)
def test_demo_runs_a_whole_round(tmp_path, tiny_model):
    if local_redis.redis_server_path() is None:
        pytest.skip("redis-server is not installed")
    port = local_redis.free_port()  # nothing answers there: the demo starts its own server
    env = {**os.environ, "CONVEYOR_CACHE": str(tmp_path / "cache")}
    args = [sys.executable, "-m", "worker.cli", "demo", "--jobs", "2", "--max-tokens", "8"]
    done = subprocess.run(
        [*args, "--redis-url", f"redis://127.0.0.1:{port}/0"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "started a local redis-server" in done.stdout and "tokens/s through Redis" in done.stdout

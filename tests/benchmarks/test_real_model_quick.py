"""The quick modes of benchmarks/throughput.py and benchmarks/redis_e2e.py on chat prompts (`--model tiny`
stands in for a real model: it has a chat template), with eos and fixed lengths, and `--quantization`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import served as served_module

ROOT = Path(__file__).resolve().parents[2]


def run(script: str, *args: str, cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CONVEYOR_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def throughput(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "t.json"
    common = ["--quick", "--num-requests", "6", "--max-output", "12", "--systems", "conveyor_continuous"]
    done = run(
        "throughput.py",
        *common,
        "--no-warmup",
        "--no-mfu",
        "--threads",
        "1",
        "--out",
        str(out),
        *args,
        cache=tmp_path / "cache",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("lengths", ["eos", "fixed"])
def test_throughput_quick_on_chat_prompts(tmp_path, lengths):
    report = throughput(tmp_path, "--model", "tiny", "--lengths", lengths)
    produced = report["results"]["conveyor_continuous"]["output_tokens"]
    if lengths == "fixed":
        assert produced == 6 * 12
    else:  # a random model may end some answers at EOS; none goes past the cap
        assert 6 <= produced <= 6 * 12
    assert report["args"]["lengths"] == lengths
    assert report["served"]["dtype"] == "float32" and report["served"]["quantization"] == "auto"
    assert report["prompt_tokens"] > 6 * 20  # rendered chat prompts, not a handful of random ids


def test_throughput_refuses_transformers_with_eos_lengths(tmp_path):
    done = run(
        "throughput.py",
        "--model",
        "tiny",
        "--systems",
        "hf_continuous_batching",
        "--lengths",
        "eos",
        cache=tmp_path,
    )
    assert done.returncode == 2 and "--lengths fixed" in done.stderr


def test_redis_e2e_quick_on_chat_prompts(tmp_path):
    if not any((Path(p) / "redis-server").exists() for p in os.environ["PATH"].split(os.pathsep)):
        pytest.skip("redis-server is not installed")
    done = run(
        "redis_e2e.py",
        "--model",
        "tiny",
        "--quick",
        "--num-requests",
        "6",
        "--max-output",
        "12",
        "--lengths",
        "fixed",
        "--torch-threads",
        "1",
        "--out",
        str(tmp_path / "out"),
        cache=tmp_path / "cache",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (path,) = (tmp_path / "out").glob("redis_e2e-*.json")
    report = json.loads(path.read_text())
    assert report["direct"]["tokens"] == report["redis"]["tokens"] == 6 * 12
    assert report["lengths"] == "fixed" and report["served"]["quantization"] == "auto"


def test_quantization_passes_through_to_the_engine():
    assert served_module.quantization_options("int4") == {"quantization": "int4"}
    assert served_module.quantization_options(None) == {}  # the engine's default


def test_both_benchmarks_keep_a_jobs_eos_choice():
    from benchmarks import redis_e2e, throughput
    from benchmarks.workload import Job

    for params in (throughput._params, redis_e2e.params):
        assert params(Job([1], 5, ignore_eos=False)).ignore_eos is False
        assert params(Job([1], 5)).ignore_eos is True

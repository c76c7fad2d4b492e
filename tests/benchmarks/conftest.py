"""`run_benchmark(script, *args)`: a benchmark script run as a reader runs it (`python benchmarks/X.py`), in a
subprocess with this checkout first on its path; tiny models and temporary files go to one cache folder
per test session, so the tiny models are made once."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def run_benchmark(tmp_path_factory) -> Callable[..., subprocess.CompletedProcess]:
    cache = tmp_path_factory.mktemp("bench-cache")
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "CONVEYOR_CACHE": str(cache),  # the tiny models (engine/cache_dir.py)
        "CONVEYOR_BENCH_CACHE": str(cache),  # the benchmarks' own models
        "TMPDIR": str(cache),  # work folders the scripts make and remove
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }

    def run(script: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        done = subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / script), *args],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert done.returncode == 0, (
            f"{script} {' '.join(args)}:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
        )
        return done

    return run


@pytest.fixture
def redis_installed() -> None:
    from worker import local_redis

    if local_redis.redis_server_path() is None:
        pytest.skip("redis-server is not installed")

"""benchmarks/http_e2e.py on the tiny model: a few jobs through Redis and through the gateway, token for token."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def test_a_small_run_reads_every_token_both_ways(run_benchmark, redis_installed, tmp_path):
    args = ["--model", "tiny", "--num-requests", "4", "--max-prompt", "16", "--max-output", "4"]
    run_benchmark("http_e2e.py", *args, "--clients", "2", "--torch-threads", "1", "--out", str(tmp_path))
    (path,) = tmp_path.glob("http_e2e-*.json")
    report = json.loads(path.read_text())
    assert report["redis"]["tokens"] == report["gateway"]["tokens"] == 4 * 4
    assert report["gateway"]["added_latency_ms"]["p99"] is not None

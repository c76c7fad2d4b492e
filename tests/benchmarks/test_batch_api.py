"""benchmarks/batch_api.py --quick: the same few lines through `conveyor batch` and through /v1/batches."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def test_quick_runs_both_sides_twice(run_benchmark, redis_installed, tmp_path):
    out = tmp_path / "b.json"
    run_benchmark("batch_api.py", "--quick", "--out", str(out))
    result = json.loads(out.read_text())
    assert result["lines"] == 4 and len(result["conveyor_batch_s"]) == len(result["batch_api_s"]) == 2
    assert result["ratio"] > 0

"""benchmarks/soak.py --quick: a few seconds of load with kills; nothing lost, duplicated or missing."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def test_quick_soak_loses_nothing(run_benchmark, redis_installed, tmp_path):
    out = tmp_path / "soak.json"
    run_benchmark("soak.py", "--quick", "--out", str(out))
    summary = json.loads(out.read_text())
    assert summary["kills"] >= 1 and summary["completed"] > 0
    assert summary["lost"] == summary["tokens_duplicated"] == summary["tokens_missing"] == 0

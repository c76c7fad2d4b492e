"""benchmarks/lanes_fairness.py --quick: a small flood through one stream and through priority and tenant lanes."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def test_quick_measures_every_figure_both_ways(run_benchmark, redis_installed, tmp_path):
    out = tmp_path / "l.json"
    run_benchmark("lanes_fairness.py", "--quick", "--out", str(out))
    results = json.loads(out.read_text())["results"]
    assert len(results) == 5
    for by in results.values():
        assert "one stream" in by and len(by) == 2 and all(v > 0 for v in by.values())

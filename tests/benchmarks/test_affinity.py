"""benchmarks/affinity.py --quick: two workers with and without prefix affinity, every job accounted for."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def test_quick_runs_both_modes(run_benchmark, redis_installed, tmp_path):
    out = tmp_path / "a.json"
    run_benchmark("affinity.py", "--quick", "--json", str(out))
    report = json.loads(out.read_text())
    for mode in ("with", "without"):
        figures = report[mode]
        assert 0 < figures["prompt_tokens_computed"] <= figures["prompt_tokens_received"]
        (per_worker,) = figures["jobs_per_worker"]
        assert len(per_worker) == 2

"""Every maintained benchmark answers --help with its usage and a quick mode, and runs nothing: a script that
took --help for an argument would run for minutes and overwrite its figures in benchmarks/results/."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

QUICK_FLAG = {
    "affinity.py": "--quick",
    "batch_api.py": "--quick",
    "generic_vs_native.py": "--quick",
    "http_e2e.py": "--quick",
    "kernels.py": "--dry-run",
    "lanes_fairness.py": "--quick",
    "redis_e2e.py": "--quick",
    "redis_scale.py": "--quick",
    "soak.py": "--quick",
    "structured_outputs.py": "--quick",
    "throughput.py": "--quick",
}


def results() -> dict[str, int]:
    return {str(p): p.stat().st_mtime_ns for p in (ROOT / "benchmarks" / "results").rglob("*") if p.is_file()}


@pytest.mark.parametrize("script", sorted(QUICK_FLAG))
def test_help_shows_usage_and_a_quick_mode(run_benchmark, script):
    before = results()
    done = run_benchmark(script, "--help", timeout=120)
    assert done.stdout.startswith("usage:") and QUICK_FLAG[script] in done.stdout
    assert results() == before

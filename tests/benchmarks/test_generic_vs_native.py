"""benchmarks/generic_vs_native.py --quick: both model paths in lockstep on the tiny models, MoE included."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.slow]


def test_quick_runs_both_paths_to_the_same_tokens(run_benchmark, tmp_path):
    out = tmp_path / "g.json"
    run_benchmark("generic_vs_native.py", "--quick", "--moe", "--threads", "1", "--out", str(out))
    report = json.loads(out.read_text())
    (run,) = report["runs"]
    assert (
        report["same_tokens"] and run["native"]["output_tokens"] == run["transformers"]["output_tokens"] > 0
    )
    assert set(report["decode_profile"]) == {"native", "transformers"}
    assert 0 < report["moe"]["experts_share_of_forward"] < 1

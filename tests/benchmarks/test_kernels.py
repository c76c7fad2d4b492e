"""benchmarks/kernels.py --dry-run: the decode-attention benchmark on the CPU (Triton interpreter, tiny shapes)."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.slow]


def test_dry_run_times_every_kernel(run_benchmark, tmp_path):
    out = tmp_path / "k.json"
    run_benchmark("kernels.py", "--dry-run", "--iters", "1", "--out", str(out))
    report = json.loads(out.read_text())
    assert report["dry_run"] is True
    assert {"triton_paged", "torch_sdpa_dense_kv"} <= set(report["decode"])
    assert all(row["best"] >= 1 for row in report["split_sweep"])

"""benchmarks/quantized.py runs in quick mode on the tiny model and writes its JSON."""

from __future__ import annotations

import json
import subprocess
import sys

from benchmarks import quantized


def test_quick_mode_runs_every_config(tmp_path):
    out = tmp_path / "q.json"
    quantized.main(["--quick", "--out", str(out)])
    rows = json.loads(out.read_text())["results"]
    assert [(r["quantization"], r["dtype"]) for r in rows] == [
        ("none", "float32"),
        ("none", "bfloat16"),
        ("int8", "bfloat16"),
        ("int4", "bfloat16"),
    ]
    assert all(r["batch_tokens_per_s"] > 0 and r["single_tokens_per_s"] > 0 for r in rows)
    assert rows[0]["batch_vs_first"] == 1.0


def test_help():
    out = subprocess.run(
        [sys.executable, "benchmarks/quantized.py", "--help"], capture_output=True, text=True
    )
    assert out.returncode == 0 and "--quick" in out.stdout and "int4:bfloat16" in out.stdout

"""benchmarks/structured_outputs.py --quick: the grammar engines on the tiny tokenizer, xgrammar in the engine."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.slow]


def test_quick_measures_both_parts(run_benchmark, tmp_path):
    out = tmp_path / "s.json"
    run_benchmark("structured_outputs.py", "--quick", "--out", str(out))
    report = json.loads(out.read_text())
    assert report["quick"] is True
    engines = report["part1_grammar_engines"]["tiny-512"]
    assert engines["xgrammar"]["compile_cold_ms_median"] > 0
    assert set(engines) == {"xgrammar", "llguidance"}  # measured, or "not installed"
    engine = report["part2_engine_xgrammar"]
    assert engine["batch"] == 4 and engine["mask_fill_and_apply_ms_median"] > 0


def test_a_part_that_does_not_exist_is_refused(run_benchmark, tmp_path):
    with pytest.raises(AssertionError, match="parts are 1 and 2"):
        run_benchmark("structured_outputs.py", "3", "--out", str(tmp_path / "s.json"), timeout=120)

"""Issue 20, item 5, in a fresh interpreter: the cases (tp_lifecycle_cases.py) test what one process may
hold (torch.distributed's one default group), so they run in a pytest process of their own, not after
the other tensor-parallel tests, whose failure cases leave ranks and stores of their own behind."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(600)
CASES = Path(__file__).with_name("tp_lifecycle_cases.py")
ROOT = Path(__file__).resolve().parents[2]


def test_tensor_parallel_engine_lifecycle_in_a_fresh_process():
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(CASES)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=550,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "3 passed" in run.stdout, run.stdout[-2000:]

"""benchmarks/gpu_imports.py: the GPU check's import walk reports each bad module and never runs a program."""

from __future__ import annotations

import subprocess
import sys

import pytest

from benchmarks.gpu_imports import import_all


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A package `walkme` with a good module, a bad one, one that exits, and a __main__ that exits."""
    root = tmp_path / "walkme"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "good.py").write_text("X = 1\n")
    (root / "bad.py").write_text("import no_such_module_here\n")
    (root / "exits.py").write_text("raise SystemExit(2)\n")
    (root / "sub" / "__init__.py").write_text("")
    (root / "sub" / "__main__.py").write_text("raise SystemExit('ran the program')\n")
    (root / "__main__.py").write_text("raise SystemExit('ran the program')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "walkme"
    for name in [m for m in sys.modules if m == "walkme" or m.startswith("walkme.")]:
        del sys.modules[name]


def test_each_bad_module_is_reported_and_main_modules_are_not_run(package):
    failed = import_all((package,))
    assert set(failed) == {"walkme.bad", "walkme.exits"}
    assert "no_such_module_here" in failed["walkme.bad"]
    assert "SystemExit(2)" in failed["walkme.exits"]
    assert "walkme.good" in sys.modules


def test_the_real_packages_import_here():
    """In a child process: importing every module must not leave its side effects in this test run."""
    code = "from benchmarks.gpu_imports import import_all; print(import_all())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "{}"

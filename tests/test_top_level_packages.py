"""Conveyor installs the top-level packages engine, kernels and worker. Another installed distribution with a
package of one of those names is shadowed by ours (or overwrites it in site-packages): transformers 5.25
requires Hugging Face's `kernels`, and with it installed `import transformers` fails at its first model
import (`cannot import name 'CUDAProperties' from 'kernels'`). pyproject.toml keeps transformers below 5.25
for that reason; these tests fail when a dependency brings such a package back."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

OURS = ("engine", "kernels", "worker")
ROOT = Path(__file__).resolve().parents[1]


def test_no_other_installed_distribution_ships_a_package_named_as_ours():
    shipped = importlib.metadata.packages_distributions()
    clashes = {name: sorted(set(shipped.get(name, [])) - {"conveyor"}) for name in OURS}
    clashes = {name: owners for name, owners in clashes.items() if owners}
    assert not clashes, f"installed distributions ship packages named as Conveyor's: {clashes}"


def test_transformers_model_code_imports_beside_our_kernels():
    # From the repository root, as the tests and `python -m worker.cli` run: our kernels/ is first on the path.
    code = "import kernels, transformers; transformers.LlamaConfig(); import transformers.integrations.hub_kernels"
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]

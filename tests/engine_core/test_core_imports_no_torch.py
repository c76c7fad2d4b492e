"""The engine's core subpackage must stay free of torch, so it builds and tests without a model."""

import subprocess
import sys
from pathlib import Path

import engine.core

CORE_MODULES = sorted(
    f"engine.core.{p.stem}" for p in Path(engine.core.__file__).parent.glob("*.py") if p.stem != "__init__"
)


def test_core_has_the_scheduler_and_block_manager():
    assert {"engine.core.scheduler", "engine.core.block_manager", "engine.core.request"} <= set(CORE_MODULES)


def test_importing_every_core_module_does_not_import_torch():
    code = (
        "import importlib, sys\n"
        f"for name in {CORE_MODULES!r}:\n"
        "    importlib.import_module(name)\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'triton') if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"engine.core imported {out.stdout.strip()}"

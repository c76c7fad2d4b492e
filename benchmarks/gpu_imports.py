"""The GPU check's imports step: every module of engine/, kernels/ and worker/ imports, with exactly the
packages that machine has plus the carried wheels; and what the environment is (environment.json).

    python -m benchmarks.gpu_imports WORK/environment.json [--dry-run]   # from the repository root

`__main__` modules are not imported: importing one runs its program (worker/cli/__main__.py runs the CLI
on this script's arguments and exits). Every other module's failure, SystemExit included, is caught and
reported by name, so one bad module does not hide the others; any failure fails the step.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import platform
import subprocess
import sys
from pathlib import Path

PACKAGES = ("engine", "kernels", "worker")


def import_all(packages: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    """Import every module under `packages`; returns {module: why it failed} (empty: all imported)."""
    failed: dict[str, str] = {}
    for package in packages:
        root = importlib.import_module(package)
        # walk_packages imports each subpackage to list it: a failing one is reported through onerror.
        mods = pkgutil.walk_packages(root.__path__, package + ".", onerror=lambda name: None)
        for mod in mods:
            if mod.name.rsplit(".", 1)[-1] == "__main__":
                continue
            try:
                importlib.import_module(mod.name)
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # SystemExit too: every failure is reported, then the step fails
                failed[mod.name] = repr(exc)
    return failed


def environment(dry_run: bool) -> dict:
    import numpy
    import torch
    import transformers
    import triton

    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "numpy": numpy.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "dry_run": dry_run,
    }
    if not dry_run:
        info["nvidia_smi"] = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
    return info


def main() -> None:
    out, dry_run = Path(sys.argv[1]), "--dry-run" in sys.argv[2:]
    info = environment(dry_run)
    out.write_text(json.dumps(info, indent=2))
    print(json.dumps(info, indent=2))
    import torch

    if not dry_run and not torch.cuda.is_available():
        sys.exit("torch sees no GPU (use --dry-run on a machine without one)")
    failed = import_all()
    print(f"imported {', '.join(PACKAGES)}; {len(failed)} modules failed")
    for name, why in failed.items():
        print(f"  {name}: {why}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

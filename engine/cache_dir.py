"""The cache folder for what Conveyor makes or fetches once: the tiny models, the built-in real models, the
tokenizers built from GGUF files. `CONVEYOR_CACHE` overrides the default ~/.cache/conveyor."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    root = os.environ.get("CONVEYOR_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "conveyor")
    return Path(root)

"""The built-in tiny model: `--model tiny` (or tiny:mistral, tiny:qwen2, tiny:qwen3) runs a small random
checkpoint made on first use in a cache folder, so the worker runs anywhere without downloads."""

from __future__ import annotations

import os

from engine.cache_dir import cache_dir
from engine.models.registry import TINY_ARCHS

ARCHS = TINY_ARCHS


def resolve_model(model: str) -> str:
    """A folder, a .gguf file or a hub id passes through; a built-in real model's short name becomes its GGUF
    file (fetched if missing, worker/cli/builtin_models.py); `tiny[:arch]` becomes the cached tiny checkpoint
    (made if missing)."""
    from worker.cli.builtin_models import BUILTIN, fetch

    if model in BUILTIN:
        return str(fetch(model))
    if model != "tiny" and not model.startswith("tiny:"):
        return model
    arch = model.partition(":")[2] or "llama"
    if arch not in ARCHS:
        raise ValueError(f"tiny model arch must be one of {', '.join(ARCHS)}, got {arch!r}")
    out = cache_dir() / f"tiny-{arch}"
    if not (out / "config.json").exists():
        from engine.tiny_model import make_tiny_model

        tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
        make_tiny_model(tmp, arch=arch)
        try:
            tmp.rename(out)  # atomic: several workers may start at once
        except OSError:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    return str(out)

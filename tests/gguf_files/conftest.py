"""Tiny GGUF files written from the tiny random checkpoints (tests/helpers/gguf_writer.py), once per session."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers.gguf_writer import write_gguf

# The GGUF families and how each tiny source model is made. Gemma: llama.cpp scales queries by head_dim
# (convert_hf_to_gguf.py writes no query_pre_attn_scalar), so the source model must too.
FAMILIES = {
    "llama": {},
    "qwen2": {},
    "qwen3": {},
    "gemma2": {"config_overrides": {"query_pre_attn_scalar": 16}},
    "gemma3": {"config_overrides": {"query_pre_attn_scalar": 16}},
}


@pytest.fixture(scope="session")
def tiny_gguf(tiny_model_dir, tmp_path_factory) -> Callable[..., tuple[Path, Path]]:
    """`tiny_gguf(arch, qtype="F32") -> (source checkpoint folder, .gguf file)`."""
    made: dict[tuple[str, str], tuple[Path, Path]] = {}

    def get(arch: str, qtype: str = "F32") -> tuple[Path, Path]:
        if (arch, qtype) not in made:
            source = tiny_model_dir(arch, **FAMILIES[arch])
            out = tmp_path_factory.mktemp(f"gguf_{arch}") / f"{arch}-{qtype}.gguf"
            made[arch, qtype] = source, write_gguf(source, out, qtype)
        return made[arch, qtype]

    return get


@pytest.fixture(autouse=True)
def own_cache(monkeypatch, tmp_path):
    """Tokenizers built from GGUF files go to a fresh cache folder per test."""
    monkeypatch.setenv("CONVEYOR_CACHE", str(tmp_path / "cache"))

"""The model a benchmark serves: `--model` resolved as the CLI resolves it, `--quantization` passed through to
the engine, and what the engine actually served (dtype, quantization, weight bytes by dtype) for the JSON."""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path


def add_model_options(parser: argparse.ArgumentParser, default: str) -> None:
    parser.add_argument(
        "--model",
        default=default,
        help="a short name (smollm2-135m-instruct), a .gguf file, a checkpoint folder, or tiny[:arch]",
    )
    parser.add_argument(
        "--quantization",
        default=None,
        help="passed to the engine as `quantization` (e.g. int4, int8, fp8); default: the engine's default",
    )


def resolve(model: str) -> str:
    """A path for LLMEngine: built-in short names are fetched once, tiny models made once."""
    from worker.cli.tiny_model import resolve_model

    return resolve_model(model)


def quantization_options(quantization: str | None) -> dict[str, str]:
    """`{"quantization": q}` for LLMEngine, or nothing so the engine picks its default (auto)."""
    return {} if quantization is None else {"quantization": quantization}


def served(engine) -> dict:
    """What the engine serves: its dtype and quantization settings as resolved, and the bytes its weights
    take per storage dtype (packed int4 shows as uint8 or int32, whatever the kernels store)."""
    config = engine.config
    by_dtype: Counter[str] = Counter()
    seen: set[int] = set()
    for tensor in list(engine.model.parameters()) + list(engine.model.buffers()):
        if id(tensor) in seen:  # tied embeddings count once
            continue
        seen.add(id(tensor))
        by_dtype[str(tensor.dtype).removeprefix("torch.")] += tensor.numel() * tensor.element_size()
    return {
        "model": config.model,
        "model_file": Path(config.model).name,
        "dtype": config.dtype,
        "quantization": config.quantization,
        "weight_bytes_by_dtype": dict(sorted(by_dtype.items())),
        "device": str(engine.device),
    }

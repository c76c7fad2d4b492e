"""The one reader of a checkpoint folder: its safetensors files, every tensor by name, read lazily.

    with Checkpoint(model_dir, rename) as ckpt:
        ckpt.names           every tensor, under the model's name for it (`rename`: checkpoint name -> model's)
        ckpt.slice(name)     a lazy view (safetensors' get_slice): only what is indexed, `view[a:b]` or
                             `view[:, a:b]`, is read from disk, so a tensor-parallel rank reads its part only

The native and the generic model loaders both read through it (engine/model_loader.py,
engine/models/generic/tp_load.py); which part of a tensor a parameter takes is its weight loader's business
(engine/distributed/weight_loader.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Protocol

from safetensors import safe_open

from engine.distributed.weight_loader import SliceSource


def weight_files(model_dir: Path) -> list[Path]:
    """The safetensors files of a checkpoint: those its index names, else every *.safetensors."""
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [model_dir / n for n in names]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {model_dir}")
    return files


class TensorSource(Protocol):
    """What the weight loaders read: this class, or a GGUF file (engine/gguf_files/checkpoint.py)."""

    model_dir: Path

    def __enter__(self) -> TensorSource: ...

    def __exit__(self, *exc: object) -> None: ...

    @property
    def names(self) -> list[str]: ...

    def stored_name(self, name: str) -> str: ...

    def slice(self, name: str) -> SliceSource: ...


class Checkpoint:
    """Model tensor name -> (open safetensors file, its name there). Files stay open inside the `with`."""

    def __init__(self, model_dir: Path, rename: Callable[[str], str] = lambda name: name) -> None:
        self.model_dir = model_dir
        self.rename = rename
        self._stack = ExitStack()
        self._files: dict[str, tuple[Any, str]] = {}

    def __enter__(self) -> Checkpoint:
        for path in weight_files(self.model_dir):
            handle = self._stack.enter_context(safe_open(str(path), framework="pt", device="cpu"))
            self._files.update({self.rename(name): (handle, name) for name in handle.keys()})
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def __contains__(self, name: str) -> bool:
        return name in self._files

    @property
    def names(self) -> list[str]:
        return list(self._files)

    def stored_name(self, name: str) -> str:
        """The tensor's name in the file (for messages)."""
        return self._files[name][1]

    def slice(self, name: str) -> SliceSource:
        handle, stored = self._files[name]
        view: SliceSource = handle.get_slice(stored)
        return view

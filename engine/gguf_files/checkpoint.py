"""A GGUF file's tensors under HF names, read lazily: engine/checkpoint.py's interface for a .gguf file.

    with GGUFCheckpoint(path) as ckpt:
        ckpt.config          config.json's fields, from the metadata (metadata.py)
        ckpt.names           every tensor, under its HF name (names.py)
        ckpt.slice(name)     a lazy view: `view[a:b]`, `view[:, a:b]`, `view[:]` read and dequantize only the
                             rows asked for (a tensor-parallel rank reads its part); float32, HF row order
        ckpt.raw(name)       (qtype, blocks [rows, bytes_per_row] uint8, (rows, cols)) of a 2-D weight, rows
                             in HF order: the file's own quantized blocks, for serving them as they are

Quantized types are blocked along each row (the input dimension), so any set of whole rows can be read and
dequantized on its own; columns are cut after dequantizing. The file is memory-mapped: rows not asked for are
never read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.gguf_files.metadata import Fields, hf_config
from engine.gguf_files.names import hf_name, hf_row_order, is_gemma_norm, permuted_heads
from engine.gguf_files.reader import GGUFFile, GGUFTensor
from engine.models.registry import UnsupportedModelError


class GGUFTensorView:
    """One tensor, read on indexing. Shape in HF (torch) order: [rows, cols] for a 2-D weight."""

    def __init__(self, tensor: GGUFTensor, rows: np.ndarray | None, minus_one: bool) -> None:
        self.tensor = tensor  # .data: [rows, bytes_per_row] uint8, memory-mapped
        self.rows = rows  # [rows] GGUF row of each HF row, or None: same order
        self.minus_one = minus_one  # Gemma norms are stored as w + 1
        self.shape = tensor.shape

    def get_shape(self) -> tuple[int, ...]:
        return self.shape

    def __getitem__(self, index: object) -> torch.Tensor:
        row_index, col_index = _split(index, len(self.shape))
        if len(self.shape) == 1:
            values = self._dequantize(self._blocks(slice(None)))[row_index]
        else:
            values = self._dequantize(self._blocks(row_index))[:, col_index]
        return torch.from_numpy(np.array(values, dtype=np.float32))  # a copy: the map is read-only

    def raw_rows(self, row_index: slice) -> np.ndarray:
        """[n, bytes_per_row] uint8: the stored blocks of the HF rows asked for."""
        return self._blocks(row_index)

    def _blocks(self, row_index: slice) -> np.ndarray:
        data = self.tensor.data
        if len(self.shape) == 1:
            return np.asarray(data)  # [1, bytes]: the whole tensor
        if self.rows is None:
            return np.asarray(data[row_index])
        return np.asarray(data[self.rows[row_index]])  # fancy indexing reads only these rows

    def _dequantize(self, blocks: np.ndarray) -> np.ndarray:
        from gguf.quants import dequantize

        values = dequantize(blocks, self.tensor.tensor_type).astype(np.float32, copy=False)
        values = values.reshape(self.shape) if len(self.shape) == 1 else values.reshape(len(blocks), -1)
        return values - 1.0 if self.minus_one else values


def _split(index: object, ndim: int) -> tuple[slice, slice]:
    """`view[a:b]`, `view[:, a:b]`, `view[:]` -> (rows, columns); anything else is refused."""
    parts = index if isinstance(index, tuple) else (index,)
    if not all(isinstance(p, slice) for p in parts) or len(parts) > ndim or ndim > 2:
        raise IndexError(f"a GGUF tensor view takes slices of its {ndim} dims, got {index!r}")
    rows = parts[0] if parts else slice(None)
    cols = parts[1] if len(parts) > 1 else slice(None)
    return rows, cols


class GGUFCheckpoint:
    """HF tensor name -> the file's tensor. Opening reads only metadata and the tensor directory."""

    def __init__(self, path: str | Path) -> None:
        self.model_dir = Path(path)  # named so for engine/checkpoint.py's messages
        self.file = GGUFFile(path)
        self.fields = Fields(self.file.fields)
        self.architecture = self.fields.architecture
        by_name = {t.name: t for t in self.file.tensors}
        embed = by_name.get("token_embd.weight")
        if embed is None:
            raise UnsupportedModelError(f"{path}: no token_embd.weight tensor")
        self.config = hf_config(self.fields, set(by_name), embed.shape[0])
        self._views: dict[str, GGUFTensorView] = {}
        self._stored: dict[str, str] = {}
        for name, tensor in by_name.items():
            hf = hf_name(name, self.architecture)
            if hf is None:
                raise UnsupportedModelError(
                    f"{path}: GGUF tensor {name!r} has no place in {self.architecture}"
                )
            check_type(tensor.tensor_type, name)
            self._views[hf] = self._view(hf, tensor)
            self._stored[hf] = name

    def _view(self, hf: str, tensor: GGUFTensor) -> GGUFTensorView:
        cfg = self.config
        heads = permuted_heads(hf, self.architecture, cfg["num_attention_heads"], cfg["num_key_value_heads"])
        rows = None if heads is None else hf_row_order(tensor.shape[0], heads)
        return GGUFTensorView(tensor, rows, is_gemma_norm(hf, self.architecture))

    def __enter__(self) -> GGUFCheckpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        pass  # the memory map closes when the last view of it goes

    def __contains__(self, name: str) -> bool:
        return name in self._views

    @property
    def names(self) -> list[str]:
        return list(self._views)

    def stored_name(self, name: str) -> str:
        return self._stored[name]

    def slice(self, name: str) -> GGUFTensorView:
        return self._views[name]

    def qtype_name(self, name: str) -> str:
        """The stored type of a tensor by its HF name ("Q4_1", "Q8_0", "F32", ...)."""
        return str(self._views[name].tensor.tensor_type.name)

    def raw(self, name: str) -> tuple[Any, np.ndarray, tuple[int, int]]:
        """(gguf.GGMLQuantizationType, [rows, bytes_per_row] uint8, (rows, cols)) of a 2-D weight, rows in HF
        order. Exact for permuted Q/K too: a row's blocks move with it."""
        view = self._views[name]
        if len(view.shape) != 2:
            raise ValueError(f"{name} is not a 2-D weight (shape {view.shape})")
        return view.tensor.tensor_type, view.raw_rows(slice(None)), (view.shape[0], view.shape[1])


_CHECKED: dict[int, bool] = {}


def check_type(qtype: Any, tensor_name: str) -> None:
    """Refuse, in one line, a type the gguf package cannot dequantize (tried once per type on one block)."""
    from gguf import GGML_QUANT_SIZES
    from gguf.quants import dequantize

    if int(qtype) not in _CHECKED:
        try:
            block_bytes = GGML_QUANT_SIZES[qtype][1]
            dequantize(np.zeros((1, block_bytes), dtype=np.uint8), qtype)
            _CHECKED[int(qtype)] = True
        except (NotImplementedError, KeyError, ValueError):
            _CHECKED[int(qtype)] = False
    if not _CHECKED[int(qtype)]:
        raise UnsupportedModelError(
            f"GGUF tensor {tensor_name!r} has type {qtype.name}, which we cannot dequantize"
        )

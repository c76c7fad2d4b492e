"""A GGUF file's header read fast: its metadata (less the long arrays) and its tensor directory, each tensor a
memory-mapped [rows, bytes_per_row] uint8 array.

The `gguf` package's GGUFReader parses every element of every array into numpy views, the tokenizer's tens
of thousands of tokens and merges included, which takes seconds at every start; the loader needs none of
them (the tokenizer is built once from the file and cached, tokenizer.py). This reader walks the same
layout with `struct` and skips long arrays by their lengths:

    magic "GGUF" | version u32 | tensor count u64 | metadata count u64
    metadata:  key (u64 length + utf-8) | value type u32 | value      (an array: item type u32, count u64, items)
    tensors:   name | n_dims u32 | dims u64 x n_dims (ne0, the row length, first) | type u32 | offset u64
    padding to `general.alignment` (32), then the tensor data at those offsets

Types, block sizes and dequantizing stay the `gguf` package's (GGMLQuantizationType, GGML_QUANT_SIZES,
gguf.quants.dequantize).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.models.registry import UnsupportedModelError

MAGIC = b"GGUF"
ALIGNMENT = 32  # llama.cpp's default, unless general.alignment says otherwise
LONG_ARRAY = 64  # arrays longer than this (vocabularies) are skipped, not parsed
# value type -> struct format (scalars); 8 is a string, 9 an array
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
STRING, ARRAY = 8, 9


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    tensor_type: Any  # gguf.GGMLQuantizationType
    shape: tuple[int, ...]  # torch order: [rows, cols] for a 2-D weight
    data: np.ndarray  # [rows, bytes_per_row] uint8, memory-mapped (a 1-D tensor is one row)


class GGUFFile:
    """`fields`: key -> value (long arrays -> None); `tensors`: in file order."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.map = np.memmap(self.path, dtype=np.uint8, mode="r")
        buf = memoryview(self.map.data)  # the mapped bytes, for struct
        if bytes(buf[:4]) != MAGIC:
            raise UnsupportedModelError(f"{path}: not a GGUF file (no GGUF magic)")
        version, n_tensors, n_fields = struct.unpack_from("<IQQ", buf, 4)
        if version not in (2, 3):
            raise UnsupportedModelError(
                f"{path}: GGUF version {version} unsupported (big-endian?); supported: 2, 3"
            )
        at = 24
        self.fields: dict[str, Any] = {}
        for _ in range(n_fields):
            key, at = _string(buf, at)
            (kind,), at = struct.unpack_from("<I", buf, at), at + 4
            self.fields[key], at = _value(buf, at, kind)
        infos = []
        for _ in range(n_tensors):
            name, at = _string(buf, at)
            (n_dims,), at = struct.unpack_from("<I", buf, at), at + 4
            dims, at = struct.unpack_from(f"<{n_dims}Q", buf, at), at + 8 * n_dims
            qtype, offset = struct.unpack_from("<IQ", buf, at)
            at += 12
            infos.append((name, dims, qtype, offset))
        align = int(self.fields.get("general.alignment") or ALIGNMENT)
        start = -(-at // align) * align
        self.tensors = [
            self._tensor(name, dims, qtype, start + offset) for name, dims, qtype, offset in infos
        ]

    def _tensor(self, name: str, dims: tuple[int, ...], qtype_id: int, at: int) -> GGUFTensor:
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        try:
            qtype = GGMLQuantizationType(qtype_id)
        except ValueError as e:
            raise UnsupportedModelError(f"GGUF tensor {name!r} has unknown type {qtype_id}") from e
        block, block_bytes = GGML_QUANT_SIZES[qtype]
        if dims[0] % block:
            raise UnsupportedModelError(
                f"GGUF tensor {name!r}: rows of {dims[0]} are not whole {qtype.name} blocks"
            )
        rows = int(np.prod(dims[1:], dtype=np.int64)) if len(dims) > 1 else 1
        row_bytes = dims[0] // block * block_bytes
        data = self.map[at : at + rows * row_bytes].reshape(rows, row_bytes)
        return GGUFTensor(name, qtype, tuple(int(d) for d in reversed(dims)), data)


def _string(buf: memoryview, at: int) -> tuple[str, int]:
    (n,) = struct.unpack_from("<Q", buf, at)
    return bytes(buf[at + 8 : at + 8 + n]).decode("utf-8", errors="replace"), at + 8 + n


def _value(buf: memoryview, at: int, kind: int) -> tuple[Any, int]:
    if kind in _SCALARS:
        fmt = _SCALARS[kind]
        return struct.unpack_from(fmt, buf, at)[0], at + struct.calcsize(fmt)
    if kind == STRING:
        return _string(buf, at)
    if kind != ARRAY:
        raise UnsupportedModelError(f"GGUF metadata value type {kind} unknown")
    item, count = struct.unpack_from("<IQ", buf, at)
    at += 12
    if count > LONG_ARRAY:  # skipped by its items' sizes
        if item in _SCALARS:
            return None, at + count * struct.calcsize(_SCALARS[item])
        for _ in range(count):
            _, at = _value(buf, at, item)
        return None, at
    values = []
    for _ in range(count):
        value, at = _value(buf, at, item)
        values.append(value)
    return values, at

"""GGUF checkpoints (llama.cpp's and Ollama's file format), served through the same loaders as a HF folder.

metadata.py   the file's key-value metadata -> a HF-style config dict (config.json's fields)
names.py      llama.cpp tensor names -> HF names, and the Q/K row order llama.cpp uses for rotary
checkpoint.py the tensors, read lazily and dequantized row range by row range (engine/checkpoint.py's
              interface), plus `raw` blocks for quantized serving
tokenizer.py  the tokenizer and chat template from the file, built once and cached by the file's hash
"""

from __future__ import annotations

from pathlib import Path

SUFFIX = ".gguf"


def is_gguf(model: str | Path) -> bool:
    """A path naming a .gguf file (the engine takes a folder, a hub id, or such a file)."""
    path = Path(model)
    return path.suffix.lower() == SUFFIX and path.is_file()

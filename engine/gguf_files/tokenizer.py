"""The tokenizer and chat template inside a GGUF file, as a transformers fast tokenizer, built once per file.

transformers builds a fast tokenizer from a GGUF vocabulary (`AutoTokenizer.from_pretrained(folder,
gguf_file=...)`), but slowly: tens of seconds for a 49k-token BPE vocabulary. The result is saved under the
cache folder (engine/cache_dir.py), in `gguf-tokenizers/<file key>/`, and later starts load that folder.

The key is the file's size and a SHA-256 over sampled parts (its first and last MiB and 16 chunks between):
it reads about 3 MiB whatever the file's size, and a different file (another quantization, another model)
differs in its header and metadata, which lie in the first MiB with the vocabulary.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from engine.cache_dir import cache_dir

SAMPLE = 1 << 20  # bytes read at each end
CHUNK = 1 << 16  # bytes read at each of the sampled places between
CHUNKS = 16


def file_key(path: Path) -> str:
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with path.open("rb") as f:
        places = [0, max(0, size - SAMPLE)] + [size * k // (CHUNKS + 1) for k in range(1, CHUNKS + 1)]
        for k, at in enumerate(places):
            f.seek(at)
            digest.update(f.read(SAMPLE if k < 2 else CHUNK))
    return f"{size}-{digest.hexdigest()[:24]}"


def tokenizer_dir(path: Path) -> Path:
    return cache_dir() / "gguf-tokenizers" / file_key(path)


def load_gguf_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """The file's tokenizer (and chat template): from the cache, else built from the file and cached."""
    path = Path(path)
    cached = tokenizer_dir(path)
    if (cached / "tokenizer_config.json").exists():
        return AutoTokenizer.from_pretrained(str(cached))
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    tmp = cached.with_name(f"{cached.name}.tmp-{os.getpid()}")
    tokenizer.save_pretrained(str(tmp))
    try:
        tmp.rename(cached)  # atomic: several workers may build it at once; the first one's stays
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return tokenizer

"""The tokenizer and chat template from a GGUF file: built once, then loaded from the cache by the file's key."""

from __future__ import annotations

import shutil

import pytest
import transformers

from engine.gguf_files import tokenizer as gguf_tokenizer
from engine.gguf_files.tokenizer import file_key, load_gguf_tokenizer, tokenizer_dir
from engine.tokenizer import load_tokenizer

TEXT = "The quick brown fox jumps over the lazy dog."


def test_the_tokenizer_encodes_as_the_source_checkpoints(tiny_gguf):
    folder, path = tiny_gguf("llama")
    source = transformers.AutoTokenizer.from_pretrained(str(folder))
    built = load_tokenizer(path)  # a .gguf path takes the GGUF route
    assert built.encode(TEXT) == source.encode(TEXT)
    chat = [{"role": "user", "content": "hi"}]
    assert built.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == (
        source.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    )


def test_a_second_load_reads_the_cache_not_the_file(tiny_gguf, monkeypatch):
    _, path = tiny_gguf("qwen2")
    first = load_gguf_tokenizer(path)
    assert (tokenizer_dir(path) / "tokenizer_config.json").exists()
    real = transformers.AutoTokenizer.from_pretrained

    def no_gguf(name, *args, **kwargs):
        if "gguf_file" in kwargs:
            raise AssertionError("built from the GGUF file again")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(gguf_tokenizer.AutoTokenizer, "from_pretrained", no_gguf)
    assert load_gguf_tokenizer(path).encode(TEXT) == first.encode(TEXT)


def test_the_key_tells_files_apart(tiny_gguf, tmp_path):
    _, a = tiny_gguf("llama")
    _, b = tiny_gguf("llama", "F16")
    copy = shutil.copy(a, tmp_path / "copy.gguf")
    assert file_key(a) == file_key(copy) and file_key(a) != file_key(b)
    with pytest.raises(FileNotFoundError):
        file_key(tmp_path / "missing.gguf")

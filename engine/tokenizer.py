"""The tokenizer: a transformers fast tokenizer loaded offline from the checkpoint folder, plus helpers for
the eos ids and chat-template rendering the engine needs.

`load_tokenizer` returns the transformers object itself (encode / decode / eos_token_id / chat_template /
apply_chat_template), so the detokenizer and engine use one familiar interface.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from engine.gguf_files import is_gguf


def load_tokenizer(model_dir: str | Path, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    """From the checkpoint folder, or from a GGUF file's metadata (built once, then cached)."""
    try:
        if is_gguf(model_dir):
            from engine.gguf_files.tokenizer import load_gguf_tokenizer

            return load_gguf_tokenizer(model_dir)
        return AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=trust_remote_code)
    except Exception as e:
        raise FileNotFoundError(
            f"could not load a tokenizer from {model_dir}: {type(e).__name__}: {e}"
        ) from e


def eos_token_ids(tokenizer: PreTrainedTokenizerBase, model_eos_ids: Iterable[int] = ()) -> frozenset[int]:
    """Every id that ends a sequence: the model's (config.json and generation_config.json, read by the
    model loader) plus the tokenizer's own eos. The engine calls this once and passes the set down."""
    eos = getattr(tokenizer, "eos_token_id", None)
    return frozenset(int(i) for i in model_eos_ids) | (
        frozenset([eos]) if isinstance(eos, int) else frozenset()
    )


def render_chat(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, Any]], add_generation_prompt: bool = True
) -> str:
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("this tokenizer has no chat template")
    text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    assert isinstance(text, str)  # tokenize=False with one conversation renders one string
    return text


def encode_chat(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, Any]], add_generation_prompt: bool = True
) -> list[int]:
    # The rendered template already holds its special tokens: do not add bos a second time.
    return tokenizer.encode(render_chat(tokenizer, messages, add_generation_prompt), add_special_tokens=False)

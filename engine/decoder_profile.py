"""What the detokenizer needs to know about a Rust tokenizer's decoder, worked out once per engine.

Three families of fast tokenizers decode locally, each with one thing that reaches across tokens:
- byte-level BPE (GPT-2, Llama 3, Qwen): the bytes of all tokens are decoded as UTF-8 together, so a
  character may be split over tokens; text that ends in U+FFFD may still change.
- SentencePiece-style BPE with byte fallback (Llama 2, Mistral, Gemma): `▁` becomes a space, the first
  space of the whole text is stripped, and a run of byte tokens `<0xNN>` is decoded as one group: valid
  UTF-8 as a whole, or one U+FFFD per byte token. One more byte token can turn a run that decoded cleanly
  into U+FFFDs, so text is final only after a token that is not a byte token.
- Unigram with Metaspace: `▁` becomes a space and the first token's leading space is stripped.

The profile lists the byte tokens (runs stay held back until they end), the "anchor" tokens (not byte
tokens, and with text of their own: a window that starts with one has had its first space stripped
already, as the whole text has), one plain `separator` token, and, per token id, the text it adds after
an anchor with nothing held back, for decoders where that never depends on the neighbours (None where it
does). Any other decoder gets no profile: the detokenizer then only holds back text that ends in U+FFFD.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from tokenizers import Tokenizer

# What a decoder writes for bytes that are not (yet) a whole UTF-8 character.
REPLACEMENT = "\ufffd"
_LOCAL_STEPS = {"Replace", "ByteFallback", "Fuse", "Strip", "Metaspace"}


@dataclass(frozen=True)
class DecoderProfile:
    byte_level: bool  # GPT-2-style bytes: no leading-space stripping, no byte-token groups
    is_byte: bytes  # per id: 1 for a byte-fallback token <0xNN>
    is_anchor: bytes  # per id: 1 for a token that is no byte token and adds text after an anchor
    separator: int  # a plain token with ASCII text, to close a byte run the prompt ends in
    # Per id: the text the token adds after an anchor when nothing is held back, or None.
    texts: list[str | None]


def rust_tokenizer(tokenizer: object) -> Tokenizer | None:
    """The `tokenizers.Tokenizer` itself, or the one behind a transformers fast tokenizer, when decoding
    through it gives the same text (no clean-up of spaces); else None."""
    if getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return None
    backend = tokenizer if isinstance(tokenizer, Tokenizer) else getattr(tokenizer, "backend_tokenizer", None)
    return backend if isinstance(backend, Tokenizer) else None


def decoder_profile(tokenizer: object, skip_special_tokens: bool = True) -> DecoderProfile | None:
    backend = rust_tokenizer(tokenizer)
    if backend is None:
        return None
    spec = json.loads(backend.to_str())
    decoder = spec.get("decoder") or {}
    kind = decoder.get("type")
    parts = decoder.get("decoders", []) if kind == "Sequence" else [decoder]
    steps = [d.get("type") for d in parts]
    if kind == "ByteLevel":
        byte_level = True
    elif steps and set(steps) <= _LOCAL_STEPS and all(map(_strips_start_only, parts)):
        byte_level = False
    else:
        return None  # WordPiece, CTC, a Strip of trailing text...: decoded without a profile
    size = backend.get_vocab_size(with_added_tokens=True)
    is_byte = bytearray(size)
    if (spec.get("model") or {}).get("byte_fallback") and "ByteFallback" in steps:
        for b in range(256):
            token_id = backend.token_to_id(f"<0x{b:02X}>")
            if token_id is not None:
                is_byte[token_id] = 1
    added = {t["id"] for t in spec.get("added_tokens", [])}
    separator = _separator(backend, added, is_byte)
    if separator is None:
        return None
    head = backend.decode([separator], skip_special_tokens=skip_special_tokens)
    pairs = backend.decode_batch(
        [[separator, i] for i in range(size)], skip_special_tokens=skip_special_tokens
    )
    after = [p[len(head) :] if p.startswith(head) else None for p in pairs]
    is_anchor = bytes(
        1 if not is_byte[i] and text and REPLACEMENT not in text else 0 for i, text in enumerate(after)
    )
    texts: list[str | None] = [
        None if is_byte[i] or i in added or text is None or REPLACEMENT in text else text
        for i, text in enumerate(after)
    ]
    if skip_special_tokens:
        for token in spec.get("added_tokens", []):
            if token.get("special"):
                texts[token["id"]] = ""  # skipped: adds nothing wherever it stands
    return DecoderProfile(byte_level, bytes(is_byte), is_anchor, separator, texts)


def _strips_start_only(step: dict) -> bool:
    # Stripping the end of the text would take back text already emitted.
    return step.get("type") != "Strip" or not step.get("stop")


def _separator(backend: Tokenizer, added: set[int], is_byte: bytearray) -> int | None:
    """A plain token with text of its own, wherever it stands: plain ASCII letters if there is one."""
    fallback = None
    for token, token_id in sorted(backend.get_vocab(with_added_tokens=False).items(), key=lambda kv: kv[1]):
        if token_id in added or is_byte[token_id]:
            continue
        text = backend.decode([token_id])
        if token.isascii() and token.isalpha() and backend.decode([token_id, token_id]) == token * 2:
            return token_id
        if fallback is None and text and REPLACEMENT not in text:
            fallback = token_id
    return fallback

"""The text of single tokens: for logprobs (what a client shows next to each token), and for the
detokenizer's table of tokens whose text never depends on their neighbours.

A token's piece is its vocabulary entry turned back into text the way the tokenizer decodes it (byte-level
BPE maps its printable stand-ins back to bytes, SentencePiece its "▁" to a space), so the pieces of a
completion's sampled tokens join to its text. A piece that is part of a multi-byte character decodes to
U+FFFD, as OpenAI shows it. Special tokens (EOS...) give "", as the text skips them (the detokenizer's
skip_special_tokens); so do ids past the tokenizer's vocabulary (an LM head wider than it).
"""

from __future__ import annotations

from functools import lru_cache

from tokenizers import Tokenizer, decoders
from transformers import PreTrainedTokenizerBase

from engine.detokenizer import REPLACEMENT


class TokenPieces:
    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.special = frozenset(tokenizer.all_special_ids)
        self.piece = lru_cache(maxsize=65536)(self._piece)
        # Built once per engine (~20 ms at 32k tokens) and shared by every TextStream.
        self.texts = context_free_texts(tokenizer)

    def _piece(self, token_id: int) -> str:
        token = self.tokenizer.convert_ids_to_tokens(token_id)
        if not isinstance(token, str) or token_id in self.special:
            return ""
        return self.tokenizer.convert_tokens_to_string([token])

    def for_logprobs(self, logprobs: list[list[tuple[int, float]]]) -> list[list[str]]:
        """Per token: the pieces of [sampled, top-1, top-2, ...], parallel to `logprobs`."""
        return [[self.piece(token_id) for token_id, _ in per_token] for per_token in logprobs]


def context_free_texts(tokenizer: object, skip_special_tokens: bool = True) -> list[str | None] | None:
    """Per token id, the text it adds to a decoded text that ends on a character boundary, or None where
    that depends on more than the token. The whole table is None unless the tokenizer is a Rust one whose
    decoder is byte-level (GPT-2, Llama 3, Qwen...) with no clean-up: then decode(ids) is the UTF-8 decoding
    of the tokens' bytes put end to end, so a token whose bytes are complete UTF-8 always adds
    decode([id]). Tokens holding part of a multi-byte character get None. Other decoders (SentencePiece's
    leading space, byte fallback, word-piece "##") depend on the neighbours: no table.

    The detokenizer (engine/detokenizer.py) looks a token up here when it holds nothing back, instead of
    a call into the tokenizer."""
    backend = tokenizer if isinstance(tokenizer, Tokenizer) else getattr(tokenizer, "backend_tokenizer", None)
    if not isinstance(backend, Tokenizer) or getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return None
    if not isinstance(backend.decoder, decoders.ByteLevel):
        return None
    size = backend.get_vocab_size(with_added_tokens=True)
    texts = backend.decode_batch([[i] for i in range(size)], skip_special_tokens=skip_special_tokens)
    return [None if REPLACEMENT in text else text for text in texts]

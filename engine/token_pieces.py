"""The text of single tokens: for logprobs (what a client shows next to each token), and for the
detokenizer's profile of the decoder (engine/decoder_profile.py), built here once per engine.

A token's piece is its vocabulary entry turned back into text the way the tokenizer decodes it (byte-level
BPE maps its printable stand-ins back to bytes, SentencePiece its "▁" to a space), so the pieces of a
completion's sampled tokens join to its text. A piece that is part of a multi-byte character decodes to
U+FFFD, as OpenAI shows it. Special tokens (EOS...) give "", as the text skips them (the detokenizer's
skip_special_tokens); so do ids past the tokenizer's vocabulary (an LM head wider than it).
"""

from __future__ import annotations

from functools import lru_cache

from transformers import PreTrainedTokenizerBase

from engine.decoder_profile import decoder_profile


class TokenPieces:
    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.special = frozenset(tokenizer.all_special_ids)
        self.piece = lru_cache(maxsize=65536)(self._piece)
        # Built once per engine (~20 ms at 32k tokens) and shared by every TextStream.
        self.profile = decoder_profile(tokenizer)

    def _piece(self, token_id: int) -> str:
        token = self.tokenizer.convert_ids_to_tokens(token_id)
        if not isinstance(token, str) or token_id in self.special:
            return ""
        return self.tokenizer.convert_tokens_to_string([token])

    def for_logprobs(self, logprobs: list[list[tuple[int, float]]]) -> list[list[str]]:
        """Per token: the pieces of [sampled, top-1, top-2, ...], parallel to `logprobs`."""
        return [[self.piece(token_id) for token_id, _ in per_token] for per_token in logprobs]

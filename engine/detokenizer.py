"""Incremental detokenization: text deltas that never end in half a UTF-8 character.

Only `tokenizer.decode(ids, skip_special_tokens=...)` is used, so a `tokenizers.Tokenizer` or a transformers
tokenizer both work (give the latter `clean_up_tokenization_spaces=False`, or its decode is not additive).

Each step decodes a small window `ids[prefix_offset:]` rather than the whole output:

    ids:  ... | prefix_offset ......... read_offset ......... len(ids)
                 \\__ already emitted __/ \\__ new, not emitted __/
    delta = decode(ids[prefix_offset:]) minus its first len(decode(ids[prefix_offset:read_offset])) chars

The already-emitted tokens in the window give decoders that strip a leading space (SentencePiece) their
context. A decoded window that ends in U+FFFD (an unfinished multi-byte character) is held back; when
several tokens arrive at once we walk back to the last token boundary that decodes cleanly, so what has been
emitted depends only on the tokens seen, not on how they were grouped (a resumed request can replay its prior
tokens in one call). For byte-level BPE tokenizers the deltas (plus `finish()`) concatenate to exactly
`decode(output_ids)`. The window starts with up to 5 prompt tokens as context, unless they end mid-character.

With a Rust tokenizer (`tokenizers.Tokenizer`, or the one behind a transformers fast tokenizer) the same
algorithm runs inside `tokenizers.decoders.DecodeStream`, one token at a time: one call into Rust per token
(~3 us) instead of two decodes plus the Python around them (~12 us); 256 requests per step is then ~1 ms.
The offsets are mirrored here so `finish()` can release what DecodeStream still holds back.

Commoner still, with a byte-level BPE tokenizer: a token whose bytes are complete UTF-8, arriving when
nothing is held back, adds exactly its own text whatever came before, so it is looked up in a table
(`engine.token_pieces.context_free_texts`, built once per tokenizer) with no call into Rust (~0.1 us).
DecodeStream's window then misses that token, which changes nothing for such a decoder: the window only
matters for bytes still held back, and there were none. Tokens with partial characters, and anything
after one until it is released, go through DecodeStream as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, cast

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from engine.core.stop_strings import StopStrings

# What a decoder writes for bytes that are not (yet) a whole UTF-8 character.
REPLACEMENT = "\ufffd"
_PROMPT_CONTEXT = 5


class Decoder(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str: ...


def _backend(tokenizer: Decoder) -> Decoder:
    """The `tokenizers.Tokenizer` behind a transformers fast tokenizer, whose decode skips the wrapper's
    per-call Python work (~4x faster per call); its text equals the wrapper's when that does no clean-up."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return backend
    return tokenizer


class IncrementalDetokenizer:
    def __init__(
        self,
        tokenizer: Decoder,
        prompt_token_ids: Sequence[int],
        skip_special_tokens: bool = True,
        prior_output_ids: Sequence[int] = (),
        texts: Sequence[str | None] | None = None,
    ):
        """texts: `context_free_texts(tokenizer, skip_special_tokens)`, or None to decode every token."""
        self.tokenizer = _backend(tokenizer)
        self._texts: Sequence[str | None] = texts if texts is not None else ()
        self.skip_special_tokens = skip_special_tokens
        context = list(prompt_token_ids[-_PROMPT_CONTEXT:])
        if self._decode(context).endswith(REPLACEMENT):
            # The prompt ends mid-character: its bytes would merge with the output's. Start clean instead.
            context = []
        self._ids: list[int] = context
        self._prefix_offset = 0
        self._read_offset = len(context)
        self._parts: list[str] = []  # everything emitted so far, joined on demand (no O(n) copy per step)
        self._stream: DecodeStream | None = None
        if isinstance(self.tokenizer, Tokenizer):
            self._stream = DecodeStream(ids=context, skip_special_tokens=skip_special_tokens)
        if prior_output_ids:
            # Resume: replay silently; the state (and `text`) equals that of the worker that emitted them.
            self.add(prior_output_ids)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens) if ids else ""

    def add(self, token_ids: Sequence[int]) -> str:
        """Append generated tokens; return the newly decodable text (possibly "")."""
        if len(token_ids) == 1 and self._read_offset == len(self._ids):
            # Nothing held back: a token whose text does not depend on its neighbours is looked up.
            token, texts = token_ids[0], self._texts
            if token < len(texts) and (text := texts[token]) is not None:
                if text:
                    self._parts.append(text)
                return text
        if self._stream is not None and len(token_ids) == 1:
            # A decode step: one token, one call into Rust (the loop below, without its Python around it).
            ids = self._ids
            ids.append(token_ids[0])
            piece = self._stream.step(cast(Tokenizer, self.tokenizer), token_ids[0])
            return "" if piece is None else self._emit(piece, len(ids))
        if self._stream is not None:
            return self._add_streamed(self._stream, cast(Tokenizer, self.tokenizer), token_ids)
        self._ids.extend(token_ids)
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        for end in range(len(self._ids), self._read_offset, -1):
            window = self._decode(self._ids[self._prefix_offset : end])
            if not window.endswith(REPLACEMENT):
                return self._emit(window[len(prefix_text) :], end)
        return ""

    def _add_streamed(self, stream: DecodeStream, tokenizer: Tokenizer, token_ids: Sequence[int]) -> str:
        ids = self._ids
        texts = self._texts
        pieces = []
        for t in token_ids:
            if self._read_offset == len(ids) and t < len(texts):
                text = texts[t]
                if text is not None:  # as in add(): nothing held back, a context-free token
                    if text:
                        pieces.append(text)
                        self._parts.append(text)
                    continue
            ids.append(t)
            piece = stream.step(tokenizer, t)  # None: held back (unfinished character, or no new text)
            if piece is not None:
                pieces.append(self._emit(piece, len(ids)))
        return "".join(pieces)

    def finish(self) -> str:
        """The request is over: release what was held back (a trailing U+FFFD for unfinished bytes)."""
        if self._read_offset == len(self._ids):
            return ""
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        window = self._decode(self._ids[self._prefix_offset :])
        return self._emit(window[len(prefix_text) :], len(self._ids))

    def _emit(self, delta: str, end: int) -> str:
        # Ids before the new prefix offset are never decoded again: drop them (memory stays a small window).
        del self._ids[: self._read_offset]
        self._prefix_offset, self._read_offset = 0, end - self._read_offset
        if delta:
            self._parts.append(delta)
        return delta

    @property
    def text(self) -> str:
        """Everything emitted so far."""
        return "".join(self._parts)


class TextStream:
    """What the engine keeps per sample: detokenizer + stop checker.

    `append` returns (text delta to send, stopped); after a stop the engine finishes the request with reason
    "stop" and the text ends before the stop string. When the request ends otherwise, `finish()` returns the
    rest. The deltas concatenate to `text`. With `prior_output_ids` (a resumed request) the prior tokens are
    replayed silently, so the next deltas continue exactly where the previous worker's left off.
    """

    def __init__(
        self,
        tokenizer: Decoder,
        prompt_token_ids: Sequence[int],
        stop: list[str],
        prior_output_ids: Sequence[int] = (),
        skip_special_tokens: bool = True,
        texts: Sequence[str | None] | None = None,
    ):
        """texts: the tokenizer's `context_free_texts` table (built for the same skip_special_tokens)."""
        self._detokenizer = IncrementalDetokenizer(
            tokenizer, prompt_token_ids, skip_special_tokens, texts=texts
        )
        self._stops = StopStrings(stop)
        # What was emitted, when it differs from the detokenizer's text (only with stop strings).
        self._parts: list[str] = []
        if prior_output_ids:
            self.append(prior_output_ids)

    @property
    def stopped(self) -> bool:
        return self._stops.stopped

    def append(self, token_ids: Sequence[int]) -> tuple[str, bool]:
        stops = self._stops
        if not stops.stop:  # no stop strings: everything decoded is emitted
            return self._detokenizer.add(token_ids), False
        if stops.stopped:
            return "", True
        delta, stopped = stops.feed(self._detokenizer.add(token_ids))
        if delta:
            self._parts.append(delta)
        return delta, stopped

    @property
    def text(self) -> str:
        """Everything emitted so far: the concatenated deltas."""
        return "".join(self._parts) if self._stops.stop else self._detokenizer.text

    def finish(self) -> str:
        if self.stopped:
            return ""
        delta, stopped = self._stops.feed(self._detokenizer.finish())
        if not stopped:
            delta += self._stops.flush()
        if delta and self._stops.stop:
            self._parts.append(delta)
        return delta

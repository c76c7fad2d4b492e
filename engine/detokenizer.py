"""Incremental detokenization: exact text, streamed in deltas that are never taken back.

The text of a generated sequence is its continuation of the prompt, `decode(prompt + output)` minus
`decode(prompt)`, so a first token that starts a word keeps its space under SentencePiece decoders. Each
step decodes a small window rather than the whole output:

    ids:  context | ... prefix_offset ......... read_offset ......... len(ids)
                         \\__ already emitted __/ \\__ new, not emitted __/
    delta = decode(ids[prefix_offset:end]) minus decode(ids[prefix_offset:read_offset])

for the largest `end` after which the text can no longer change (engine/decoder_profile.py says when: not
inside a byte-fallback run, and not ending in U+FFFD, an unfinished UTF-8 character). The window starts at
an "anchor", a token with text of its own, so the first-space stripping of SentencePiece decoders falls on
text that was already emitted, as it does in the whole text. The first window starts at the prompt's last
anchor; a prompt that ends inside a byte run (or, byte-level, mid-character) gets a plain separator token
after it, so the output's bytes decode on their own, as if the prompt had ended on a character boundary.

What has been emitted depends only on the tokens seen, not on how they were grouped into calls, so a
resumed request replays its prior tokens in one call and continues where the previous worker stopped.
`finish()` releases what is held back as the tokenizer's own decode writes it (U+FFFD for unfinished bytes).

Most steps cost no call into the tokenizer: a token whose text never depends on its neighbours, arriving
when nothing is held back, adds the text the profile's table lists for it (~0.1 us).

Only `tokenizer.decode(ids, skip_special_tokens=...)` is called, so a `tokenizers.Tokenizer` or a
transformers tokenizer both work. Without a profile (a decoder of another family, or a tokenizer that is
no Rust one) the window holds back only text that ends in U+FFFD, and a window whose text stops matching
what was emitted is skipped rather than raised on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from engine.core.stop_strings import StopStrings
from engine.decoder_profile import REPLACEMENT, DecoderProfile, decoder_profile, rust_tokenizer

__all__ = ["REPLACEMENT", "Decoder", "IncrementalDetokenizer", "TextStream"]

_GENERIC_CONTEXT = 5  # prompt tokens of context without a profile
_MAX_CONTEXT = 64  # prompt tokens searched back for an anchor
_AUTO = object()  # build the profile from the tokenizer


class Decoder(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str: ...


class IncrementalDetokenizer:
    def __init__(
        self,
        tokenizer: Decoder,
        prompt_token_ids: Sequence[int],
        skip_special_tokens: bool = True,
        prior_output_ids: Sequence[int] = (),
        profile: DecoderProfile | None | object = _AUTO,
    ):
        """profile: `decoder_profile(tokenizer, skip_special_tokens)`, built once per engine and shared;
        by default built here; None decodes without one."""
        backend = rust_tokenizer(tokenizer)
        # The Rust tokenizer's decode skips the transformers wrapper's per-call Python (~4x faster).
        self.tokenizer: Decoder = backend if backend is not None else tokenizer
        self.skip_special_tokens = skip_special_tokens
        if profile is _AUTO:
            profile = decoder_profile(tokenizer, skip_special_tokens)
        assert profile is None or isinstance(profile, DecoderProfile)
        self._profile: DecoderProfile | None = profile
        context = self._context(list(prompt_token_ids))
        self._ids: list[int] = context
        self._prefix_offset = 0
        self._read_offset = len(context)
        # Table lookups need the window's first-space stripping done (SentencePiece): an anchor in it.
        self._anchored = profile is not None and (profile.byte_level or any(map(self._is_anchor, context)))
        self._parts: list[str] = []  # everything emitted so far, joined on demand (no O(n) copy per step)
        if prior_output_ids:
            # Resume: replay silently; the state (and `text`) equals that of the worker that emitted them.
            self.add(prior_output_ids)

    # ---- token classes (ids past the tokenizer's vocabulary, from a wider LM head, have no text)
    def _is_anchor(self, token: int) -> bool:
        p = self._profile
        return p is not None and 0 <= token < len(p.is_anchor) and p.is_anchor[token] == 1

    def _is_byte(self, token: int) -> bool:
        p = self._profile
        return p is not None and 0 <= token < len(p.is_byte) and p.is_byte[token] == 1

    def _context(self, prompt: list[int]) -> list[int]:
        p = self._profile
        if p is None:
            context = prompt[-_GENERIC_CONTEXT:]
            # The prompt ends mid-character: its bytes would merge with the output's. Start clean instead.
            return [] if self._decode(context).endswith(REPLACEMENT) else context
        if p.byte_level:
            # Bytes decode the same whatever precedes a character boundary: no context needed, and a
            # prompt that ends mid-character must not lend its bytes to the output.
            return []
        start = len(prompt)
        for i in range(len(prompt) - 1, max(len(prompt) - _MAX_CONTEXT, 0) - 1, -1):
            start = i
            if self._is_anchor(prompt[i]):
                break
        context = prompt[start:]
        if not self._stable(context, len(context)):
            context.append(p.separator)  # close the prompt's byte run
        return context

    def _stable(self, ids: list[int], end: int) -> bool:
        """No later token can change the text of ids[:end]: the last token with text or bytes before
        `end` is not a byte-fallback token (a run of them is decoded as one group)."""
        if self._profile is None or self._profile.byte_level:
            return True
        for i in range(end - 1, -1, -1):
            token = ids[i]
            if self._is_byte(token):
                return False
            if self._is_anchor(token):
                return True
        return True

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens) if ids else ""

    def add(self, token_ids: Sequence[int]) -> str:
        """Append generated tokens; return the newly final text (possibly "")."""
        p = self._profile
        if p is not None and len(token_ids) == 1 and self._anchored and self._read_offset == len(self._ids):
            # Nothing held back: a token whose text does not depend on its neighbours is looked up.
            token = token_ids[0]
            if 0 <= token < len(p.texts) and (text := p.texts[token]) is not None:
                if text:
                    self._parts.append(text)
                return text
        self._ids.extend(token_ids)
        return self._advance()

    def _advance(self) -> str:
        ids, prefix = self._ids, self._prefix_offset
        prefix_text = self._decode(ids[prefix : self._read_offset])
        for end in range(len(ids), self._read_offset, -1):
            if not self._stable(ids, end):
                continue
            window = self._decode(ids[prefix:end])
            # A window that stops matching what was emitted only happens with decoders no profile covers.
            if not window.endswith(REPLACEMENT) and window.startswith(prefix_text):
                return self._emit(window[len(prefix_text) :], end)
        return ""

    def finish(self) -> str:
        """The request is over: release what was held back, as decode writes it."""
        ids, prefix = self._ids, self._prefix_offset
        if self._read_offset == len(ids):
            return ""
        prefix_text = self._decode(ids[prefix : self._read_offset])
        window = self._decode(ids[prefix:])
        if not window.startswith(prefix_text):  # (see _advance) emit what differs, never raise
            same = 0
            while same < min(len(window), len(prefix_text)) and window[same] == prefix_text[same]:
                same += 1
            prefix_text = prefix_text[:same]
        return self._emit(window[len(prefix_text) :], len(ids))

    def _emit(self, delta: str, end: int) -> str:
        ids, p = self._ids, self._profile
        if p is None:
            new_prefix = self._read_offset  # vLLM's window: the last emitted tokens stay as context
        elif p.byte_level:
            new_prefix = end  # bytes after a character boundary need no context
        else:
            # The last anchor before `end` starts the next window (else the window keeps its start).
            new_prefix = next((i for i in range(end - 1, self._prefix_offset - 1, -1) if self._is_anchor(ids[i])), self._prefix_offset)  # fmt: skip
            self._anchored = self._anchored or self._is_anchor(ids[new_prefix])
        # Ids before the new prefix offset are never decoded again: drop them (memory stays a small window).
        del ids[:new_prefix]
        self._prefix_offset, self._read_offset = 0, end - new_prefix
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
        profile: DecoderProfile | None | object = _AUTO,
    ):
        """profile: the tokenizer's `decoder_profile` (built for the same skip_special_tokens)."""
        self._detokenizer = IncrementalDetokenizer(
            tokenizer, prompt_token_ids, skip_special_tokens, profile=profile
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

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
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from engine.core.stop_strings import StopStrings

_REPLACEMENT = "\ufffd"
_PROMPT_CONTEXT = 5
_MIN_BATCH = 128


class Decoder(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str: ...


def _backend(tokenizer: Decoder) -> Decoder:
    """The `tokenizers.Tokenizer` behind a transformers fast tokenizer, whose decode skips the wrapper's
    per-call Python work (~4x faster per call); its text equals the wrapper's when that does no clean-up."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return backend
    return tokenizer


def decode_many(tokenizer: Decoder, seqs: list[list[int]], skip_special_tokens: bool) -> list[str]:
    """decode() of each id list; one call into the Rust tokenizer when it offers `decode_batch`."""
    batch = getattr(tokenizer, "decode_batch", None)
    # decode_batch has a fixed cost (~0.4 ms: it hands the work to a thread pool); worth it for many.
    if batch is not None and len(seqs) >= _MIN_BATCH:
        return batch(seqs, skip_special_tokens=skip_special_tokens)
    return [tokenizer.decode(ids, skip_special_tokens=skip_special_tokens) if ids else "" for ids in seqs]


class IncrementalDetokenizer:
    def __init__(
        self,
        tokenizer: Decoder,
        prompt_token_ids: Sequence[int],
        skip_special_tokens: bool = True,
        prior_output_ids: Sequence[int] = (),
    ):
        self.tokenizer = _backend(tokenizer)
        self.skip_special_tokens = skip_special_tokens
        context = list(prompt_token_ids[-_PROMPT_CONTEXT:])
        if self._decode(context).endswith(_REPLACEMENT):
            # The prompt ends mid-character: its bytes would merge with the output's. Start clean instead.
            context = []
        self._ids: list[int] = context
        self._prefix_offset = 0
        self._read_offset = len(context)
        self._parts: list[str] = []  # everything emitted so far, joined on demand (no O(n) copy per step)
        if prior_output_ids:
            # Resume: replay silently; the state (and `text`) equals that of the worker that emitted them.
            self.add(prior_output_ids)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens) if ids else ""

    def add(self, token_ids: Sequence[int]) -> str:
        """Append generated tokens; return the newly decodable text (possibly "")."""
        prefix, window = self.windows(token_ids)
        return self.settle(self._decode(prefix), self._decode(window))

    def windows(self, token_ids: Sequence[int]) -> tuple[list[int], list[int]]:
        """Append generated tokens; return the two id windows to decode: ids[prefix:read], ids[prefix:].
        Decode them (possibly batched with other requests') and pass the texts to `settle`."""
        self._ids.extend(token_ids)
        ids, p = self._ids, self._prefix_offset
        return ids[p : self._read_offset], ids[p:]

    def settle(self, prefix_text: str, window_text: str) -> str:
        """The delta, given the decoded windows of the last `windows` call."""
        if not window_text.endswith(_REPLACEMENT):
            return self._emit(window_text[len(prefix_text) :], len(self._ids))
        for end in range(len(self._ids) - 1, self._read_offset, -1):
            window = self._decode(self._ids[self._prefix_offset : end])
            if not window.endswith(_REPLACEMENT):
                return self._emit(window[len(prefix_text) :], end)
        return ""

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
    ):
        self._detokenizer = IncrementalDetokenizer(tokenizer, prompt_token_ids, skip_special_tokens)
        self._stops = StopStrings(stop)
        self._parts: list[str] = []
        if prior_output_ids:
            self.append(prior_output_ids)

    @property
    def stopped(self) -> bool:
        return self._stops.stopped

    def append(self, token_ids: Sequence[int]) -> tuple[str, bool]:
        if self.stopped:
            return "", True
        return self._feed(self._detokenizer.add(token_ids))

    def _feed(self, text: str) -> tuple[str, bool]:
        delta, stopped = self._stops.feed(text)
        if delta:
            self._parts.append(delta)
        return delta, stopped

    @property
    def text(self) -> str:
        """Everything emitted so far: the concatenated deltas."""
        return "".join(self._parts)

    def finish(self) -> str:
        if self.stopped:
            return ""
        delta, stopped = self._stops.feed(self._detokenizer.finish())
        if not stopped:
            delta += self._stops.flush()
        if delta:
            self._parts.append(delta)
        return delta


def append_many(streams: Sequence[TextStream], token_ids: Sequence[Sequence[int]]) -> list[tuple[str, bool]]:
    """`[s.append(ids) for s, ids in zip(streams, token_ids)]`, with the decodes of all streams that share a
    tokenizer done in one `decode_batch` call (one step of 256 requests: 1 call instead of 512)."""
    out: list[tuple[str, bool]] = [("", True)] * len(streams)
    groups: dict[tuple[int, bool], list[int]] = {}
    windows: list[tuple[list[int], list[int]]] = [([], [])] * len(streams)
    for i, (stream, ids) in enumerate(zip(streams, token_ids, strict=True)):
        if stream.stopped:
            continue
        detok = stream._detokenizer
        windows[i] = detok.windows(ids)
        groups.setdefault((id(detok.tokenizer), detok.skip_special_tokens), []).append(i)
    for (_, skip), members in groups.items():
        tokenizer = streams[members[0]]._detokenizer.tokenizer
        seqs = [w for i in members for w in windows[i]]
        texts = decode_many(tokenizer, seqs, skip)
        for j, i in enumerate(members):
            stream = streams[i]
            out[i] = stream._feed(stream._detokenizer.settle(texts[2 * j], texts[2 * j + 1]))
    return out

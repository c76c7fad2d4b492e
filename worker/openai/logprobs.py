"""Token events' logprobs -> the `logprobs` of an OpenAI choice.

Each token event of a job that asked for logprobs carries, per token, `logprobs` ([[sampled_id, logprob],
[top_id, logprob], ...]) and, parallel to it, `logprob_tokens` (each listed token's text piece, from the
worker's tokenizer). `SampleLogprobs` gathers them per sample in token order; `chat_logprobs` and
`completion_logprobs` write OpenAI's two shapes. `bytes` is the piece's UTF-8 (a piece that is part of a
multi-byte character was decoded to U+FFFD by the worker, so its bytes are those of U+FFFD).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from worker.protocol import TokenEvent


@dataclass
class SampleLogprobs:
    # Per generated token: [(piece, logprob) of the sampled token, then of each top alternative].
    tokens: list[list[tuple[str, float]]] = field(default_factory=list)

    def add(self, event: TokenEvent) -> None:
        logprobs, pieces = event.logprobs, event.logprob_tokens
        if logprobs is None or pieces is None:
            return
        for per_token, per_piece in zip(logprobs, pieces, strict=True):
            self.tokens.append([(p, float(lp)) for (_, lp), p in zip(per_token, per_piece, strict=True)])

    @property
    def finite(self) -> bool:
        """No logprob is -inf (a token that cannot be sampled) or NaN."""
        return all(math.isfinite(lp) for listed in self.tokens for _, lp in listed)


def _entry(piece: str, logprob: float) -> dict[str, Any]:
    return {"token": piece, "logprob": logprob, "bytes": list(piece.encode())}


def chat_logprobs(sample: SampleLogprobs) -> dict[str, Any]:
    content = [
        {**_entry(*listed[0]), "top_logprobs": [_entry(*alt) for alt in listed[1:]]}
        for listed in sample.tokens
    ]
    return {"content": content, "refusal": None}


def completion_logprobs(sample: SampleLogprobs, at: int = 0) -> dict[str, Any]:
    """`at`: the text offset of the first token (a streamed chunk's: the length of the pieces before it)."""
    offsets = []
    for listed in sample.tokens:
        offsets.append(at)
        at += len(listed[0][0])
    return {
        "tokens": [listed[0][0] for listed in sample.tokens],
        "token_logprobs": [listed[0][1] for listed in sample.tokens],
        "top_logprobs": [dict(listed[1:]) for listed in sample.tokens],
        "text_offset": offsets,
    }

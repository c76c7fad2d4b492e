"""`echo` and `prompt_logprobs` on `/v1/completions`: the prompt's tokens and log-probabilities in the answer.

    body {"prompt": "The cat", "echo": true, "logprobs": 1, "max_tokens": 0}
    job  {"prompt": "The cat", "prompt_logprobs": 1, "max_tokens": 1}
    choice {"text": "The cat", "finish_reason": "length", "logprobs": {"tokens": ["The", " cat"],
            "token_logprobs": [null, -3.2], "top_logprobs": [null, {" dog": -2.9}], "text_offset": [0, 3]}}

OpenAI's legacy completions (and vLLM): `echo: true` puts the prompt before the completion, in the text and,
with `logprobs: k`, in the logprobs; the first prompt token has none (null). `max_tokens: 0` with echo
scores the prompt only: the job generates one token (the engine samples at least one), which is not shown
and not counted. vLLM's `prompt_logprobs: k` asks for the prompt's logprobs on their own: each choice gets
`prompt_logprobs`, vLLM's list (null, then per position {token id: {logprob, rank, decoded_token}}).

The worker sends the prompt's logprobs once, on sample 0's first token event (`prompt_logprobs`, and the
pieces in `prompt_logprob_tokens`, the first prompt token's own piece first; docs/protocol.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from worker.protocol import Event, TokenEvent


class EchoError(ValueError):
    """A body whose echo / prompt_logprobs / max_tokens cannot be honoured."""


@dataclass(frozen=True)
class Echo:
    """What a completions body asked about its prompt beyond what the job says."""

    echo: bool  # the prompt before each choice's text (and logprobs)
    only: bool  # echo with max_tokens 0: the prompt alone, the generated token hidden
    logprobs: int | None  # the body's logprobs (top k): echoed logprobs then include the prompt's
    vllm: bool  # vLLM's prompt_logprobs: each choice's `prompt_logprobs`
    prompt_text: str | None  # the prompt as given, when a string (the echoed text)

    @property
    def needs_scores(self) -> bool:
        """Whether the job must ask the worker for the prompt's logprobs (and pieces)."""
        return self.vllm or (self.echo and (self.logprobs is not None or self.prompt_text is None))


def take_echo(body: dict, job: dict) -> Echo | None:
    """Pop `echo` and `prompt_logprobs` from a completions body and set the job's `prompt_logprobs` and
    `max_tokens` (after the prompt, max_tokens and logprobs are in the job). None when neither is asked."""
    echo, vllm_k = body.pop("echo", None), body.pop("prompt_logprobs", None)
    if echo is not None and not isinstance(echo, bool):
        raise EchoError("echo must be a boolean")
    if vllm_k is not None and (
        not isinstance(vllm_k, int) or isinstance(vllm_k, bool) or not 0 <= vllm_k <= 20
    ):
        raise EchoError("prompt_logprobs must be an integer from 0 to 20")
    zero = job.get("max_tokens") == 0 and not isinstance(job.get("max_tokens"), bool)
    only = bool(echo) and zero
    if zero and not echo:
        raise EchoError("max_tokens 0 needs echo: true (it scores the prompt only)")
    if not echo and vllm_k is None:
        return None
    shape = Echo(bool(echo), only, job.get("logprobs"), vllm_k is not None, job.get("prompt"))
    if shape.needs_scores:
        job["prompt_logprobs"] = max(vllm_k or 0, job.get("logprobs") or 0)
    if only:
        job["max_tokens"] = 1
    return shape


@dataclass(frozen=True)
class PromptScores:
    """The prompt as the worker sent it: per prompt token, its piece, and its logprobs as
    [[token_id, logprob], [top_id, logprob], ...] (None for the first)."""

    pieces: list[str]
    logprobs: list[list[tuple[int, float]] | None]
    top_pieces: list[list[str]]  # per prompt token: the pieces of its listed top tokens

    @classmethod
    def of(cls, event: TokenEvent) -> PromptScores | None:
        logprobs, pieces = event.prompt_logprobs, event.prompt_logprob_tokens
        if logprobs is None or pieces is None:
            return None
        return cls([p[0] if p else "" for p in pieces], logprobs, [p[1:] for p in pieces])

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def completion_logprobs(self, k: int) -> dict[str, Any]:
        """The prompt part of a legacy completion's `logprobs` (top k at each position; null first)."""
        offsets, at = [], 0
        for piece in self.pieces:
            offsets.append(at)
            at += len(piece)
        tops: list[dict[str, float] | None] = []
        for listed, names in zip(self.logprobs, self.top_pieces, strict=True):
            tops.append(
                None
                if listed is None
                else dict(zip(names[:k], (lp for _, lp in listed[1 : k + 1]), strict=True))
            )
        return {
            "tokens": list(self.pieces),
            "token_logprobs": [None if listed is None else listed[0][1] for listed in self.logprobs],
            "top_logprobs": tops,
            "text_offset": offsets,
        }

    def vllm(self) -> list[dict[str, dict[str, Any]] | None]:
        """vLLM's `prompt_logprobs`: null, then per position {token id: {logprob, rank, decoded_token}},
        the prompt token's own entry first (its rank: where it stands in the top list, null if not in it)."""
        out: list[dict[str, dict[str, Any]] | None] = []
        for listed, piece, names in zip(self.logprobs, self.pieces, self.top_pieces, strict=True):
            if listed is None:
                out.append(None)
                continue
            (token, logprob), top = listed[0], listed[1:]
            ids = [t for t, _ in top]
            rank = ids.index(token) + 1 if token in ids else None
            entry = {str(token): {"logprob": logprob, "rank": rank, "decoded_token": piece}}
            for r, ((t, lp), name) in enumerate(zip(top, names, strict=True), start=1):
                entry.setdefault(str(t), {"logprob": lp, "rank": r, "decoded_token": name})
            out.append(entry)
        return out


def echoed_text(echo: Echo, scores: PromptScores | None) -> str:
    """The prompt's text as echoed: as given, or (token ids) its pieces joined."""
    if echo.prompt_text is not None:
        return echo.prompt_text
    return scores.text if scores is not None else ""


def prompt_scores(events: list[Event]) -> PromptScores | None:
    """The prompt's logprobs from a job's events (the first token event that carries them)."""
    for event in events:
        if isinstance(event, TokenEvent) and event.prompt_logprobs is not None:
            return PromptScores.of(event)
    return None


def echo_choice(echo: Echo, choice: dict[str, Any], scores: PromptScores | None) -> dict[str, Any]:
    """A whole (not streamed) completions choice with the prompt echoed / its prompt_logprobs added."""
    choice = dict(choice)
    if echo.vllm:
        choice["prompt_logprobs"] = scores.vllm() if scores is not None else None
    if not echo.echo:
        return choice
    if echo.only:
        choice["text"], choice["finish_reason"] = "", "length"
        if choice.get("logprobs") is not None:
            choice["logprobs"] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    prompt = echoed_text(echo, scores)
    choice["text"] = prompt + choice["text"]
    if echo.logprobs is not None and scores is not None:
        prompt_part = scores.completion_logprobs(echo.logprobs)
        choice["logprobs"] = join_logprobs(prompt_part, choice.get("logprobs"), len(prompt))
    return choice


def join_logprobs(prompt: dict[str, Any], completion: dict[str, Any] | None, shift: int) -> dict[str, Any]:
    """The prompt's legacy logprobs followed by the completion's, whose text offsets move by `shift`."""
    if completion is None:
        return prompt
    return {
        "tokens": prompt["tokens"] + completion["tokens"],
        "token_logprobs": prompt["token_logprobs"] + completion["token_logprobs"],
        "top_logprobs": prompt["top_logprobs"] + completion["top_logprobs"],
        "text_offset": prompt["text_offset"] + [at + shift for at in completion["text_offset"]],
    }

"""A job's events -> OpenAI's streamed chunks (`chat.completion.chunk` or `text_completion`), as SSE bytes.

    data: {"id": "chatcmpl-<job id>", "object": "chat.completion.chunk", "choices": [{"index": 0,
           "delta": {"role": "assistant", "content": ""}, ...}]}        one per choice, first
    data: {... "choices": [{"index": k, "delta": {"content": "<token event text>"}, "logprobs": ...}]}
    data: {... "choices": [{"index": k, "delta": {}, "finish_reason": "stop"}]}   one per choice, at done
    data: {... "choices": [], "usage": {...}}                           with stream_options.include_usage
    data: [DONE]

An error after the stream began (the worker's error event, a stop at the deadline) is a chunk holding
only OpenAI's error object, which the SDKs raise as an APIError, then [DONE].

Every chunk is a dict encoded by `sse`: compact JSON, UTF-8 as it is, a logprob that cannot be sampled
written -Infinity as the answer sent whole writes it. The events come in batches (those one read of the
output stream returned); each batch's chunks are one body, so one write to the client's socket, however
many tokens the batch holds.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from worker.gateway.errors import APIError, from_worker, timed_out
from worker.openai.echo import Echo, PromptScores, echoed_text
from worker.openai.logprobs import SampleLogprobs, chat_logprobs, completion_logprobs
from worker.openai.request import CHAT_URL
from worker.openai.response import finish_reasons
from worker.protocol import TERMINAL, DoneEvent, ErrorEvent, Event, TokenEvent

DONE = b"data: [DONE]\n\n"
# json.dumps with any option set makes an encoder per call.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def sse(payload: dict[str, Any]) -> bytes:
    """One server-sent event holding `payload`."""
    return b"data: " + _ENCODER.encode(payload).encode() + b"\n\n"


@dataclass
class ChunkEncoder:
    url: str
    job_id: str
    model: str
    n: int
    include_usage: bool
    timeout_s: float
    created: int = field(default_factory=lambda: int(time.time()))
    # A completions body's echo / prompt_logprobs (worker/openai/echo.py): the prompt goes out first, at
    # the opening (a text prompt echoed without logprobs) or with the event carrying its logprobs.
    echo: Echo | None = None

    def __post_init__(self) -> None:
        # Per sample, the length of the token pieces shown so far: a completion chunk's text_offset
        # counts from the start of the sample's text, as the answer sent whole does.
        self._offsets: dict[int, int] = {}
        self._echoed = False  # the prompt went out (echo / prompt_logprobs): once

    @property
    def chat(self) -> bool:
        return self.url == CHAT_URL

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        body: dict[str, Any] = {
            "id": f"{'chatcmpl' if self.chat else 'cmpl'}-{self.job_id}",
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if self.include_usage:
            body["usage"] = None
        body.update(extra)
        return sse(body)

    def _choice(self, k: int, text: str | None, finish: str | None, logprobs: Any) -> dict[str, Any]:
        if self.chat:
            delta = {} if text is None else {"content": text}
            return {"index": k, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return {"index": k, "text": text or "", "logprobs": logprobs, "finish_reason": finish}

    def opening(self) -> list[bytes]:
        if not self.chat:
            echo = self.echo
            return self._echo(None) if echo is not None and echo.echo and not echo.needs_scores else []
        opened = {"role": "assistant", "content": ""}
        return [
            self._chunk([{"index": k, "delta": opened, "logprobs": None, "finish_reason": None}])
            for k in range(self.n)
        ]

    def _echo(self, scores: PromptScores | None) -> list[bytes]:
        """Per choice, a chunk with the echoed prompt (its text, and its logprobs when asked) and/or vLLM's
        prompt_logprobs; later text offsets count from the end of the echoed prompt."""
        echo = self.echo
        assert echo is not None
        self._echoed = True
        text = echoed_text(echo, scores) if echo.echo else ""
        shown = None
        if echo.echo and echo.logprobs is not None and scores is not None:
            shown = scores.completion_logprobs(echo.logprobs)
        out = []
        for k in range(self.n):
            choice = self._choice(k, text, None, shown)
            if echo.vllm:
                choice["prompt_logprobs"] = scores.vllm() if scores is not None else None
            self._offsets[k] = len(text)
            out.append(self._chunk([choice]))
        return out

    def token(self, event: TokenEvent) -> bytes | None:
        if self.echo is not None and not self.chat:
            return self._echo_token(event, self.echo)
        return self._token_chunk(event)

    def _echo_token(self, event: TokenEvent, echo: Echo) -> bytes | None:
        """A token event of a job with echo or prompt_logprobs: the prompt's chunks with the event carrying
        its scores; with max_tokens 0 nothing of the generated token."""
        scored = event.prompt_logprobs is not None and not self._echoed
        first = b"".join(self._echo(PromptScores.of(event))) if scored else b""
        if echo.only:
            return first or None
        return first + (self._token_chunk(event) or b"") or None

    def _token_chunk(self, event: TokenEvent) -> bytes | None:
        k, shown = event.sample or 0, None
        if event.logprobs is not None:
            sample = SampleLogprobs()
            sample.add(event)
            if self.chat:
                shown = chat_logprobs(sample)
            else:
                shown = completion_logprobs(sample, self._offsets.get(k, 0))
                if shown["tokens"]:
                    self._offsets[k] = shown["text_offset"][-1] + len(shown["tokens"][-1])
        elif not event.text:
            return None  # text held back (a possible stop string, an unfinished character)
        return self._chunk([self._choice(k, event.text, None, shown)])

    def ending(self, done: DoneEvent) -> list[bytes]:
        reasons = finish_reasons(done)
        if "abort" in reasons:
            why = done.reason
            error = (
                timed_out(self.timeout_s)
                if why == "deadline"
                else APIError(500, f"the job was stopped ({why or 'aborted'})", type="server_error", code=why)
            )
            return [self.error(error)]
        prompt, completion = done.usage.prompt_tokens, done.usage.completion_tokens
        if self.echo is not None and self.echo.only and not self.chat:
            reasons, completion = ["length"] * len(reasons), 0  # the prompt scored, nothing generated shown
        out = [self._chunk([self._choice(k, None, why, None)]) for k, why in enumerate(reasons)]
        if self.include_usage:
            usage = {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            }
            out.append(self._chunk([], usage=usage))
        return out

    @staticmethod
    def error(error: APIError) -> bytes:
        return sse(error.body())

    def body(self, batch: list[Event], first: bool) -> tuple[bytes, bool]:
        """The body for one read's events (the opening chunks before the first's), and whether it is the
        last: a terminal event ends it with [DONE]. Empty when the events show no text yet."""
        pieces = self.opening() if first else []
        for event in batch:
            if isinstance(event, TokenEvent):
                if (piece := self.token(event)) is not None:
                    pieces.append(piece)
            elif isinstance(event, DoneEvent):
                pieces.extend(self.ending(event))
            elif isinstance(event, ErrorEvent):
                pieces.append(self.error(from_worker(event.code, event.message)))
        if batch[-1].type in TERMINAL:
            return b"".join(pieces) + DONE, True
        return b"".join(pieces), False

    def expired(self) -> bytes:
        """The last body of a stream whose job ran past the request's timeout."""
        return self.error(timed_out(self.timeout_s)) + DONE

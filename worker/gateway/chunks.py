"""A job's events -> OpenAI's streamed chunks (`chat.completion.chunk` or `text_completion`), as SSE bytes.

    data: {"id": "chatcmpl-<job id>", "object": "chat.completion.chunk", "choices": [{"index": 0,
           "delta": {"role": "assistant", "content": ""}, ...}]}        one per choice, first
    data: {... "choices": [{"index": k, "delta": {"content": "<token event text>"}, "logprobs": ...}]}
    data: {... "choices": [{"index": k, "delta": {}, "finish_reason": "stop"}]}   one per choice, at done
    data: {... "choices": [], "usage": {...}}                           with stream_options.include_usage
    data: [DONE]

An error after the stream began (the worker's error event, a stop at the deadline) is a chunk holding
only OpenAI's error object, which the SDKs raise as an APIError, then [DONE].

The events come in batches (those one read of the output stream returned); each batch's chunks are one
body, so one write to the client's socket, however many tokens the batch holds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from worker.batch.openai_echo import Echo, PromptScores, echoed_text
from worker.batch.openai_input import CHAT_URL
from worker.batch.openai_logprobs import SampleLogprobs, chat_logprobs, completion_logprobs
from worker.gateway.errors import APIError, from_worker, timed_out
from worker.gateway.job_io import TERMINAL
from worker.gateway.sse import DONE, hole, json_bytes, sse, sse_template


@dataclass
class ChunkWriter:
    url: str
    job_id: str
    model: str
    n: int
    include_usage: bool
    timeout_s: float
    created: int = field(default_factory=lambda: int(time.time()))
    # A completions body's echo / prompt_logprobs (worker/batch/openai_echo.py): the prompt goes out first,
    # at the opening (a text prompt echoed without logprobs) or with the event carrying its logprobs.
    echo: Echo | None = None

    def __post_init__(self) -> None:
        # Per sample, the length of the token pieces shown so far: a completion chunk's text_offset
        # counts from the start of the sample's text, as the answer sent whole does.
        self._offsets: dict[int, int] = {}
        self._echoed = False  # the prompt went out (echo / prompt_logprobs): once
        # The chunks that differ per event, cut where what differs goes: a token's (its sample's index,
        # its text, its logprobs), a choice's last one (its index, its finish reason) and the usage.
        self._token = sse_template(self._payload([self._choice(hole(0), hole(1), None, hole(2))]), 3)
        self._finish = sse_template(self._payload([self._choice(hole(0), None, hole(1), None)]), 2)
        usage = {"prompt_tokens": hole(0), "completion_tokens": hole(1), "total_tokens": hole(2)}
        self._usage = sse_template(self._payload([], usage=usage), 3)

    @property
    def chat(self) -> bool:
        return self.url == CHAT_URL

    def _chunk(self, choices: list[dict], **extra: Any) -> bytes:
        return sse(self._payload(choices, **extra))

    def _payload(self, choices: list[dict], **extra: Any) -> dict[str, Any]:
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
        return body

    def _choice(self, k: int | str, text: str | None, finish: str | None, logprobs: Any) -> dict:
        # k and logprobs: a str for a template's holes
        if self.chat:
            delta = {} if text is None else {"content": text}
            return {"index": k, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return {"index": k, "text": text or "", "logprobs": logprobs, "finish_reason": finish}

    def opening(self) -> list[bytes]:
        if not self.chat:
            echo = self.echo
            return self._echo(None) if echo is not None and echo.echo and not echo.needs_scores else []
        return [
            self._chunk(
                [
                    {
                        "index": k,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ]
            )  # fmt: skip
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

    def token(self, event: dict) -> bytes | None:
        if self.echo is not None and not self.chat:
            return self._echo_token(event, self.echo)
        return self._token_chunk(event)

    def _echo_token(self, event: dict, echo: Echo) -> bytes | None:
        """A token event of a job with echo or prompt_logprobs: the prompt's chunks with the event carrying
        its scores; with max_tokens 0 nothing of the generated token."""
        scored = "prompt_logprobs" in event and not self._echoed
        first = b"".join(self._echo(PromptScores.of(event))) if scored else b""
        if echo.only:
            return first or None
        return first + (self._token_chunk(event) or b"") or None

    def _token_chunk(self, event: dict) -> bytes | None:
        k, shown = event.get("sample") or 0, b"null"
        if event.get("logprobs") is not None:
            sample = SampleLogprobs()
            sample.add(event)
            if self.chat:
                listed = chat_logprobs(sample)
            else:
                listed = completion_logprobs(sample, self._offsets.get(k, 0))
                if listed["tokens"]:
                    self._offsets[k] = listed["text_offset"][-1] + len(listed["tokens"][-1])
            # orjson: an order of magnitude faster than json, the same JSON but for an exponent's padding
            # (-1.2e-7, not -1.2e-07); it writes -inf (a token that cannot be sampled) as null, and json
            # as -Infinity, as the answer sent whole does.
            shown = orjson.dumps(listed) if sample.finite else json_bytes(listed)
        elif not event["text"]:
            return None  # text held back (a possible stop string, an unfinished character)
        head, after_index, after_text, tail = self._token
        text = json_bytes(event["text"])  # a str (worker/protocol.py's TokenEvent)
        return b"".join((head, b"%d" % k, after_index, text, after_text, shown, tail))

    def batch(self, events: list[dict]) -> list[bytes]:
        """The chunks of events read together (the error chunk for a worker's error event)."""
        out = []
        for event in events:
            if event["type"] == "token":
                if (piece := self.token(event)) is not None:
                    out.append(piece)
            elif event["type"] == "done":
                out.extend(self.ending(event))
            else:
                out.append(self.error(from_worker(event["code"], event["message"])))
        return out

    def ending(self, done: dict) -> list[bytes]:
        reasons = done.get("finish_reasons") or [done["finish_reason"]]
        if "abort" in reasons:
            why = done.get("reason")
            error = (
                timed_out(self.timeout_s)
                if why == "deadline"
                else APIError(500, f"the job was stopped ({why or 'aborted'})", type="server_error", code=why)
            )
            return [self.error(error)]
        if self.echo is not None and self.echo.only and not self.chat:
            reasons = ["length"] * len(reasons)  # the prompt scored, nothing generated shown
            done = {**done, "usage": {**done["usage"], "completion_tokens": 0}}
        head, after_index, tail = self._finish
        out = [
            b"".join((head, b"%d" % k, after_index, json_bytes(why), tail)) for k, why in enumerate(reasons)
        ]
        if self.include_usage:
            prompt, completion = done["usage"]["prompt_tokens"], done["usage"]["completion_tokens"]
            head, after_prompt, after_completion, tail = self._usage
            counts = (
                b"%d" % prompt,
                after_prompt,
                b"%d" % completion,
                after_completion,
                b"%d" % (prompt + completion),
            )
            out.append(b"".join((head, *counts, tail)))
        return out

    @staticmethod
    def error(error: APIError) -> bytes:
        return sse(error.body())

    def body(self, batch: list[dict], first: bool) -> tuple[bytes, bool]:
        """The body for one read's events (the opening chunks before the first's), and whether it is the
        last: a terminal event ends it with [DONE]. Empty when the events show no text yet."""
        pieces = self.opening() if first else []
        pieces += self.batch(batch)
        if batch[-1]["type"] in TERMINAL:
            return b"".join(pieces) + DONE, True
        return b"".join(pieces), False

    def expired(self) -> bytes:
        """The last body of a stream whose job ran past the request's timeout."""
        return self.error(timed_out(self.timeout_s)) + DONE

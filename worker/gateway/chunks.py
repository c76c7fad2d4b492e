"""A job's events -> OpenAI's streamed chunks (`chat.completion.chunk` or `text_completion`), as SSE bytes.

    data: {"id": "chatcmpl-<job id>", "object": "chat.completion.chunk", "choices": [{"index": 0,
           "delta": {"role": "assistant", "content": ""}, ...}]}        one per choice, first
    data: {... "choices": [{"index": k, "delta": {"content": "<token event text>"}, "logprobs": ...}]}
    data: {... "choices": [{"index": k, "delta": {}, "finish_reason": "stop"}]}   one per choice, at done
    data: {... "choices": [], "usage": {...}}                           with stream_options.include_usage
    data: [DONE]

An error after the stream began (the worker's error event, a stop at the deadline) is a chunk holding
only OpenAI's error object, which the SDKs raise as an APIError, then [DONE].
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from worker.batch.openai_input import CHAT_URL
from worker.batch.openai_logprobs import SampleLogprobs, chat_logprobs, completion_logprobs
from worker.gateway.errors import APIError, from_worker, timed_out
from worker.gateway.sse import DONE, sse


@dataclass
class ChunkWriter:
    url: str
    job_id: str
    model: str
    n: int
    include_usage: bool
    timeout_s: float
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def chat(self) -> bool:
        return self.url == CHAT_URL

    def _chunk(self, choices: list[dict], **extra: Any) -> bytes:
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

    def _choice(self, k: int, text: str | None, finish: str | None, logprobs: dict | None) -> dict:
        if self.chat:
            delta = {} if text is None else {"content": text}
            return {"index": k, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return {"index": k, "text": text or "", "logprobs": logprobs, "finish_reason": finish}

    def opening(self) -> list[bytes]:
        if not self.chat:
            return []
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

    def token(self, event: dict) -> bytes | None:
        shown = None
        if event.get("logprobs") is not None:
            sample = SampleLogprobs()
            sample.add(event)
            shown = chat_logprobs(sample) if self.chat else completion_logprobs(sample)
        if not event["text"] and shown is None:
            return None  # text held back (a possible stop string, an unfinished character)
        return self._chunk([self._choice(event.get("sample") or 0, event["text"], None, shown)])

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
        out = [self._chunk([self._choice(k, None, reason, None)]) for k, reason in enumerate(reasons)]
        if self.include_usage:
            prompt, completion = done["usage"]["prompt_tokens"], done["usage"]["completion_tokens"]
            usage = {"prompt_tokens": prompt, "completion_tokens": completion,
                     "total_tokens": prompt + completion}  # fmt: skip
            out.append(self._chunk([], usage=usage))
        return out

    @staticmethod
    def error(error: APIError) -> bytes:
        return sse(error.body())


async def chunks(writer: ChunkWriter, events: AsyncIterator[dict], first: dict) -> AsyncIterator[bytes]:
    """SSE bytes for the events, `first` (already read) included, ending with [DONE]."""
    for chunk in writer.opening():
        yield chunk

    async def all_events() -> AsyncIterator[dict]:
        yield first
        async for event in events:
            yield event

    try:
        async for event in all_events():
            if event["type"] == "token":
                if (piece := writer.token(event)) is not None:
                    yield piece
            elif event["type"] == "done":
                for chunk in writer.ending(event):
                    yield chunk
            else:
                yield writer.error(from_worker(event["code"], event["message"]))
    except TimeoutError:
        yield writer.error(timed_out(writer.timeout_s))
    finally:
        await events.aclose()  # type: ignore[attr-defined]  # an async generator: stop following
    yield DONE

"""A server-sent-events response that notices a client leaving while it waits for the next event.

Starlette's StreamingResponse learns of a disconnect only when it next sends (ASGI 2.4) or cancels its
iterator inside a task group where no await may follow; here the stream runs under `unless_disconnected`
(in the task answering the request, so the first chunk goes out without a task started for it), and a
client that leaves first gets `on_disconnect` awaited (the gateway cancels the job), with the stream
already stopped.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from json.encoder import encode_basestring  # the C encoder's, when built
from typing import Any

from starlette.responses import Response

from worker.gateway.disconnect import ClientLeft, unless_disconnected

DONE = b"data: [DONE]\n\n"


# json.dumps with any option set makes an encoder per call.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def json_bytes(value: Any) -> bytes:
    """Compact JSON, UTF-8 as it is (not \\u-escaped)."""
    if isinstance(value, str):  # what the encoder writes for a string, without its checks
        return encode_basestring(value).encode()
    return _ENCODER.encode(value).encode()


def sse(payload: dict) -> bytes:
    return b"data: " + json_bytes(payload) + b"\n\n"


# Part of every placeholder: a payload's other strings (a model name a client chose) cannot hold one.
_UNGUESSABLE = uuid.uuid4().hex


def hole(k: int) -> str:
    """The k-th placeholder value for `sse_template`."""
    return f"\x00hole{k}:{_UNGUESSABLE}\x00"


def sse_template(payload: dict[str, Any], holes: int) -> list[bytes]:
    """`sse(payload)` cut at the placeholders `hole(0)`, ..., `hole(holes - 1)` (each once, in that order), so
    that joining the parts with each hole's JSON between them is `sse` of the payload filled in: a chunk
    that differs per token costs the JSON of what differs, not a dict built and dumped whole."""
    parts, rest = [], sse(payload)
    for k in range(holes):
        head, found, rest = rest.partition(json_bytes(hole(k)))
        if not found:
            raise ValueError(f"hole {k} is not in the payload, or not in order")
        parts.append(head)
    return [*parts, rest]


class EventStream(Response):
    def __init__(
        self,
        chunks: AsyncIterator[bytes],
        headers: dict[str, str],
        on_disconnect: Callable[[], Awaitable[None]],
    ) -> None:
        super().__init__(
            status_code=200,
            media_type="text/event-stream",
            # x-accel-buffering: proxies (nginx) pass each event on at once
            headers={"cache-control": "no-cache", "x-accel-buffering": "no", **headers},
        )
        self.chunks, self.on_disconnect = chunks, on_disconnect
        # Response sized its empty body (content-length: 0); the events' length is not known ahead.
        self.raw_headers = [(k, v) for k, v in self.raw_headers if k != b"content-length"]

    async def __call__(self, scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        ended = False
        try:
            await unless_disconnected(receive, self._stream(send))
            ended = True
        except (ClientLeft, OSError):  # OSError: sending to a closed socket
            pass
        finally:
            await self.chunks.aclose()  # type: ignore[attr-defined]  # an async generator: stop following
            if not ended:  # the client left (or the stream failed): nobody will read the job's answer
                await self.on_disconnect()

    async def _stream(self, send) -> None:
        async for chunk in self.chunks:
            if chunk.endswith(DONE):  # the last body ends the response: one write, not two
                await send({"type": "http.response.body", "body": chunk, "more_body": False})
                break
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        else:
            await send({"type": "http.response.body", "body": b"", "more_body": False})

"""Server-sent events: the JSON of a chunk, chunk templates, and the streamed answer of a job.

A stream's chunks are written in the pass in which the stream hub hands out one read's events to every
stream it holds, not by a task per stream woken for it: when the engine starts or ends 50 jobs in one
step, one read holds 50 streams' first or last chunks, and woken one after another (each through its
generators, its disconnect listener, its response's set-up) the last of them waits milliseconds behind
the others. Starlette's StreamingResponse, the first
form, also learned of a disconnect only when it next sent: here a listener notices it while the stream
waits, and the job is cancelled.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable
from json.encoder import encode_basestring  # the C encoder's, when built
from typing import TYPE_CHECKING, Any, Protocol

from starlette.responses import Response

from worker.gateway.disconnect import ClientLeft, unless_disconnected
from worker.gateway.eager_send import EagerSend
from worker.gateway.errors import APIError, from_worker, timed_out
from worker.gateway.stream_hub import Sink
from worker.keys import Keys

if TYPE_CHECKING:
    from worker.gateway.chunks import ChunkWriter

DONE = b"data: [DONE]\n\n"


class EventSource(Protocol):
    """Where a job's events come from: StreamHub, or OwnReads in a cluster."""

    async def attach(self, keys: Keys, job_id: str, sink: Sink) -> None: ...

    def detach(self, keys: Keys, job_id: str, sink: Sink) -> None: ...

    def followed(self, keys: Keys, job_id: str) -> bool: ...


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
    """The streamed answer of one job. Its sink (`_feed`) takes each batch of the job's events in the
    reader's pass, and writes the status and headers with the first and a body per batch from there, each
    send run at once (EagerSend). The task answering the request only waits: for the end, for the client
    to leave (the job is cancelled), or for the deadline; and it answers a job that fails before its first
    token (the worker refused it, or it timed out) with that error's status instead of a stream."""

    def __init__(
        self,
        writer: ChunkWriter,
        events: EventSource,
        keys: Keys,
        deadline: float,
        headers: dict[str, str],
        on_abandon: Callable[[], Awaitable[None]],
    ) -> None:
        """`deadline`: loop time; `on_abandon`: awaited when the job did not end (the client left, the
        deadline passed, the answer failed), to cancel it."""
        super().__init__(
            status_code=200,
            media_type="text/event-stream",
            # x-accel-buffering: proxies (nginx) pass each event on at once
            headers={"cache-control": "no-cache", "x-accel-buffering": "no", **headers},
        )
        self.writer, self.events, self.keys, self.deadline = writer, events, keys, deadline
        self.given_headers, self.on_abandon = headers, on_abandon
        # Response sized its empty body (content-length: 0); the events' length is not known ahead.
        self.raw_headers = [(k, v) for k, v in self.raw_headers if k != b"content-length"]
        self.started = False  # the status and headers are sent
        self.job_ended = False  # its terminal event was read: sent, or answered as the refusal it is

    async def __call__(self, scope, receive, send) -> None:
        loop = asyncio.get_running_loop()
        self._send, self._outcome = EagerSend(send), loop.create_future()
        timer = loop.call_at(self.deadline, self._expire)
        job_id = self.writer.job_id
        try:
            await self.events.attach(self.keys, job_id, self._feed)
            await unless_disconnected(receive, self._sent())
        except ClientLeft:
            self._send.abandon()
            if not self.started:  # nobody reads it; counted among the answers all the same
                await Response(status_code=499)(scope, receive, send)
        except APIError as exc:  # before the first token
            exc.headers.update(self.given_headers)
            await exc.response()(scope, receive, send)
        finally:
            timer.cancel()
            self.events.detach(self.keys, job_id, self._feed)
            if not self.job_ended:
                await self.on_abandon()

    async def _sent(self) -> None:
        await self._outcome
        await self._send.drained()

    def _feed(self, events: list[dict]) -> None:
        if self._outcome.done():
            return
        try:
            first = not self.started
            if first:
                if events[0]["type"] == "error":  # refused: the job has ended
                    self.job_ended = True
                    self._outcome.set_exception(from_worker(events[0]["code"], events[0]["message"]))
                    return
                self.started = True
                self._send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            body, last = self.writer.body(events, first)
            if last:
                self.job_ended = True
                self._end(body)
            elif body:
                self._send({"type": "http.response.body", "body": body, "more_body": True})
        except Exception as exc:  # noqa: BLE001  # the task answering the request raises it
            self._outcome.set_exception(exc)

    def _expire(self) -> None:
        if self._outcome.done():
            return
        if not self.started:
            self._outcome.set_exception(timed_out(self.writer.timeout_s))
            return
        try:
            self._end(self.writer.expired())
        except Exception as exc:  # noqa: BLE001
            self._outcome.set_exception(exc)

    def _end(self, body: bytes) -> None:
        # The last body ends the response in the same message: one write, not two.
        self._send({"type": "http.response.body", "body": body, "more_body": False})
        self._outcome.set_result(None)

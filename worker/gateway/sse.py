"""The streamed answer of a job: its events, as they are read, written as SSE chunks (chunks.py).

The status line waits for the first event, so a job the worker refuses (invalid parameters, a prompt too
long) is an HTTP error with its status, not a stream. A listener notices a client that leaves while the
stream waits, and the job is cancelled.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Protocol

from starlette.responses import Response

from worker.gateway.chunks import ChunkEncoder
from worker.gateway.disconnect import ClientLeft, unless_disconnected
from worker.gateway.errors import APIError, from_worker, timed_out
from worker.keys import Keys
from worker.protocol import ErrorEvent, Event


class EventSource(Protocol):
    """Where a job's events come from: StreamHub, or OwnReads in a cluster."""

    def follow(self, keys: Keys, job_id: str, deadline: float) -> AsyncGenerator[list[Event], None]: ...

    def followed(self, keys: Keys, job_id: str) -> bool: ...


class EventStream(Response):
    """The streamed answer of one job: a body per batch of its events, until the terminal one, the client
    leaving (the job is cancelled) or the deadline; a job that fails before its first token (the worker
    refused it, or it timed out) is answered with that error's status instead of a stream."""

    def __init__(
        self,
        encoder: ChunkEncoder,
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
        self.encoder, self.events, self.keys, self.deadline = encoder, events, keys, deadline
        self.given_headers, self.on_abandon = headers, on_abandon
        # Response sized its empty body (content-length: 0); the events' length is not known ahead.
        self.raw_headers = [(k, v) for k, v in self.raw_headers if k != b"content-length"]
        self.started = False  # the status and headers are sent
        self.job_ended = False  # its terminal event was read: sent, or answered as the refusal it is

    async def __call__(self, scope, receive, send) -> None:
        batches = self.events.follow(self.keys, self.encoder.job_id, self.deadline)
        try:
            await unless_disconnected(receive, self._stream(batches, send))
        except ClientLeft:
            if not self.started:  # nobody reads it; counted among the answers all the same
                await Response(status_code=499)(scope, receive, send)
        except APIError as exc:  # before the first token
            exc.headers.update(self.given_headers)
            await exc.response()(scope, receive, send)
        finally:
            await batches.aclose()  # before on_abandon, which asks whether another request follows the job
            if not self.job_ended:
                await self.on_abandon()

    async def _stream(self, batches: AsyncIterator[list[Event]], send) -> None:
        try:
            async for events in batches:
                first = not self.started
                if first and isinstance(refused := events[0], ErrorEvent):
                    self.job_ended = True
                    raise from_worker(refused.code, refused.message)
                if first:
                    self.started = True
                    await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
                body, last = self.encoder.body(events, first)
                if last:
                    self.job_ended = True
                    # The last body ends the response in the same message: one write, not two.
                    await send({"type": "http.response.body", "body": body, "more_body": False})
                    return
                if body:
                    await send({"type": "http.response.body", "body": body, "more_body": True})
        except TimeoutError:
            if not self.started:
                raise timed_out(self.encoder.timeout_s) from None
            await send({"type": "http.response.body", "body": self.encoder.expired(), "more_body": False})

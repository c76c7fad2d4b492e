"""An ASGI `send` run at once, in the caller's turn of the loop, as far as it goes without waiting.

The stream hub writes the chunks of every stream one read returned in one synchronous pass (docs/http.md
"Streaming"). uvicorn's send writes to the socket and returns without waiting, unless the socket's buffer
is full (then it waits for the client to drain it); the wrappers of the gateway's middleware only look at
the message. So each send is stepped by hand: one that finishes is done, with no task and no turn of the
loop; one that has to wait goes on in a task, and the messages sent meanwhile queue behind it, in order.
Python 3.12's eager tasks do the same; this runs on 3.10 too.
"""

from __future__ import annotations

import asyncio
import types
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

Send = Callable[[dict], Coroutine[Any, Any, None]]  # uvicorn's send, or a middleware's wrapper of it


class EagerSend:
    def __init__(self, send: Send) -> None:
        self._send = send
        self._backlog: deque[dict] | None = None  # not None while a send waits in self._task
        self._task: asyncio.Future | None = None

    def __call__(self, message: dict) -> None:
        """Send `message` now, or after those still waiting. An error of a send made here is raised here;
        one of a send that waited is raised by `drained`."""
        if self._backlog is not None:
            self._backlog.append(message)
            return
        coro = self._send(message)
        try:
            waits_on = coro.send(None)
        except StopIteration:
            return
        self._backlog = deque()
        self._task = asyncio.ensure_future(self._finish(coro, waits_on))

    async def _finish(self, coro, waits_on: Any) -> None:
        try:
            await _resume(coro, waits_on)
            while self._backlog:
                await self._send(self._backlog.popleft())
        finally:
            self._backlog = None

    async def drained(self) -> None:
        """Returns once every message given is sent (at once, when none had to wait)."""
        if self._task is not None:
            await self._task

    def abandon(self) -> None:
        """Drop what still waits (the client left, or the answer failed)."""
        if self._task is not None:
            self._task.cancel()


@types.coroutine
def _resume(coro, waits_on: Any):
    """The rest of a coroutine stepped by hand until it yielded `waits_on`: the task awaiting this waits on
    what the coroutine waits on (a future, or None for a turn of the loop) and passes back what a task
    running the coroutine itself would (None, or the cancel thrown into it)."""
    while True:
        try:
            yield waits_on
        except BaseException as exc:  # noqa: BLE001  # a cancel, thrown into the coroutine as a task would
            try:
                waits_on = coro.throw(exc)
            except StopIteration as stop:
                return stop.value
        else:
            try:
                waits_on = coro.send(None)
            except StopIteration as stop:
                return stop.value

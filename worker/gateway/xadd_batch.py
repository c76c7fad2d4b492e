"""The jobs that requests submit in one turn of the loop, sent to Redis as one pipeline.

When the engine ends 50 jobs in one step their clients send their next requests together, and the
gateway takes them in one after another, each up to its XADD. Sent alone, each XADD costs the gateway
redis-py's command path, a socket write and a wake-up for its reply: a large share of a request's intake
in a profile. Here the first request of a turn
schedules a flush at the end of the turn, and those that reach their XADD before it ride in the same
pipeline. Each request still gets its own outcome: its entry id, or the error of its command or of the
connection. Not transactional: one job refused does not stop the others.
"""

from __future__ import annotations

import asyncio
from typing import Any


class XaddBatch:
    def __init__(self, client) -> None:
        self.client = client
        self._waiting: list[tuple[str, dict, asyncio.Future]] = []
        self._sending: set[asyncio.Future] = set()  # the loop holds its tasks weakly

    async def xadd(self, stream: str, fields: dict) -> Any:
        """XADD `fields` to `stream` in this turn's pipeline; its entry id, or its error raised."""
        loop = asyncio.get_running_loop()
        if not self._waiting:
            loop.call_soon(self._flush)
        done = loop.create_future()
        self._waiting.append((stream, fields, done))
        return await done

    def _flush(self) -> None:
        waiting, self._waiting = self._waiting, []
        # A task of its own: a request cancelled meanwhile does not stop the others' jobs being sent.
        sending = asyncio.ensure_future(self._send(waiting))
        self._sending.add(sending)
        sending.add_done_callback(self._sending.discard)

    async def _send(self, waiting: list[tuple[str, dict, asyncio.Future]]) -> None:
        waiting = [w for w in waiting if not w[2].done()]  # a request cancelled before the flush: no job
        if not waiting:
            return
        try:
            pipe = self.client.pipeline(transaction=False)
            for stream, fields, _ in waiting:
                pipe.xadd(stream, fields)
            results = await pipe.execute(raise_on_error=False)
        except BaseException as exc:  # noqa: BLE001  # the connection's error is each request's
            for _, _, done in waiting:
                if not done.done():
                    done.set_exception(exc if isinstance(exc, Exception) else ConnectionError(repr(exc)))
            if not isinstance(exc, Exception):
                raise
            return
        for (_, _, done), result in zip(waiting, results, strict=True):
            if done.done():  # its request was cancelled
                continue
            if isinstance(result, Exception):
                done.set_exception(result)
            else:
                done.set_result(result)

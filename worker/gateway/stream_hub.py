"""One reader for every output stream a gateway process follows: a single XREAD BLOCK over all of them,
each entry handed to its request, instead of one blocking XREAD (and one Redis round trip per
event) per request. With 64 streams live that is one round trip per engine step, not 64.

A stream added while the XREAD blocks would wait for it to return; so a request joining then XADDs a
note to this process's own wake stream, which every XREAD includes: the blocked read returns at once and
the next one includes the newcomer. One note per read: those joining after it (64 requests arriving
together) ride on it, and a request joining between reads needs none. Each stream is read from the last
id handed out, so a lost connection or a worker's takeover loses and repeats nothing (as job_io.follow,
which cluster mode uses instead, through own_reads.py: a multi-key XREAD must stay in one slot).

A streamed answer attaches a sink, called in the reader's own pass with each batch of its stream's
events: it writes its chunks there (worker/gateway/sse.py), so one reply's 50 streams cost one pass, not
50 tasks woken one after another, each through its generators, before its chunk goes out. An answer sent
whole awaits its events through a queue instead (`follow`). After handing out one reply's events the reader
yields to the loop, so those requests go on before it parses the next reply: otherwise a reply that
arrived meanwhile is parsed first and they wait behind it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import redis
import structlog

from worker.connection import Backoff
from worker.gateway.job_io import LOST, TERMINAL, until_terminal
from worker.keys import Keys

WAKE_TTL_S = 60
log = structlog.get_logger("conveyor.gateway")
Sink = Callable[[list[dict]], None]  # takes one read's events of its stream, in the reader's pass


class StreamHub:
    def __init__(self, client, keys: Keys, block_ms: int) -> None:
        self.client, self.block_ms = client, block_ms
        self.wake_key = f"{keys.prefix}:gateway-wake:{uuid.uuid4().hex}"
        self._wake_bytes = self.wake_key.encode()
        self._last: dict[bytes, bytes] = {}  # output stream -> last entry id handed out
        self._sinks: dict[bytes, Sink] = {}
        self._wake_last = b"$"
        self._reading = False  # an XREAD is in flight: a newcomer is not in it
        self._woken = False  # ... and a wake note was sent during it
        self._joined = asyncio.Event()
        self._closed = False

    async def attach(self, keys: Keys, job_id: str, sink: Sink) -> None:
        """From the next read on, `sink(events)` with each batch of the job's events, in order, from its
        first; the batch holding the terminal event is the last. Until `detach`."""
        key = keys.out(job_id).encode()
        self._sinks[key], self._last[key] = sink, b"0"
        self._joined.set()
        await self._wake()

    def detach(self, keys: Keys, job_id: str) -> None:
        key = keys.out(job_id).encode()
        self._sinks.pop(key, None)
        self._last.pop(key, None)

    async def follow(self, keys: Keys, job_id: str, deadline: float) -> AsyncIterator[list[dict]]:
        """The job's events in order, in the batches the reads returned, ending with the batch holding the
        terminal event; TimeoutError at `deadline` (loop time)."""
        queue: asyncio.Queue = asyncio.Queue()
        # At the deadline a None joins the queue: one timer per request, not one per event (wait_for).
        timer = asyncio.get_running_loop().call_at(deadline, queue.put_nowait, None)
        try:
            await self.attach(keys, job_id, queue.put_nowait)
            while True:
                batch = await queue.get()
                if batch is None:
                    raise TimeoutError(job_id)
                yield batch
                if batch[-1]["type"] in TERMINAL:
                    return
        finally:
            timer.cancel()
            self.detach(keys, job_id)

    async def _wake(self) -> None:
        """End the read in flight, which does not name the newcomer's stream; once per read."""
        if not self._reading or self._woken:
            return
        self._woken = True
        try:
            pipe = self.client.pipeline(transaction=False)
            pipe.xadd(self.wake_key, {b"w": b"1"}, maxlen=16, approximate=True)
            pipe.expire(self.wake_key, WAKE_TTL_S)
            await pipe.execute()
        except LOST:  # the next newcomer tries again; the reader retries on its own
            self._woken = False

    def close(self) -> None:
        """Stop the reader at its next turn (within block_ms), whether or not a cancel reaches it."""
        self._closed = True
        self._joined.set()

    async def run(self) -> None:
        """The reader: runs as long as the app (app.state.starters); stops when cancelled or closed."""
        backoff = Backoff()
        while not self._closed:
            if not self._last:
                self._joined.clear()
                await self._joined.wait()
                continue  # closed meanwhile, or someone joined
            streams: dict[Any, bytes] = {self.wake_key: self._wake_last, **self._last}
            self._reading, self._woken = True, False
            try:
                reply: Any = await self.client.xread(streams, block=self.block_ms, count=1000)
            except redis.AuthenticationError:
                raise
            except LOST:
                _raise_if_cancel_lost()
                await asyncio.sleep(backoff.next_delay())
                continue
            finally:
                self._reading = False
            _raise_if_cancel_lost()
            backoff.reset()
            if self._hand_out(reply or []):
                await asyncio.sleep(0)

    def _hand_out(self, reply: list) -> bool:
        """Each stream's events to its request's sink; whether any request got some."""
        handed = False
        for key, entries in reply:
            key = key if isinstance(key, bytes) else key.encode()
            if key == self._wake_bytes:
                self._wake_last = entries[-1][0]
                continue
            sink = self._sinks.get(key)
            if sink is None:  # its request ended meanwhile
                continue
            self._last[key] = entries[-1][0]
            batch = until_terminal(entries)
            ended = batch[-1]["type"] in TERMINAL  # nothing follows
            try:
                sink(batch)
            except Exception:  # one answer's failure is its own: the others' events still go out
                log.exception("a stream's events could not be handed out", stream=key.decode())
                ended = True
            if ended:
                self._sinks.pop(key, None)
                self._last.pop(key, None)
            handed = True
        return handed


def _raise_if_cancel_lost() -> None:
    """A cancel that lands inside redis-py's blocking XREAD is sometimes swallowed there (redis-py 8.1: the
    read returns its empty reply; about 1 in 100 cancels here), and the reader would block again. Python
    3.11 counts the cancel (Task.cancelling) though it was not delivered; 3.10 cannot tell, and there the
    reader stops when closed."""
    cancelling = getattr(asyncio.current_task(), "cancelling", None)
    if cancelling is not None and cancelling() > 0:
        raise asyncio.CancelledError

"""One reader for every output stream a gateway process follows: a single XREAD BLOCK over all of them,
each entry handed to its request, instead of one blocking XREAD (and one Redis round trip per
event) per request. With 64 streams live that is one round trip per engine step, not 64.

A stream added while the XREAD blocks would wait for it to return; so a request joining then XADDs a
note to this process's own wake stream, which every XREAD includes: the blocked read returns at once and
the next one includes the newcomer. One note per read: those joining after it (64 requests arriving
together) ride on it, and a request joining between reads needs none. Each stream is read from the last
id handed out, so a lost connection or a worker's takeover loses and repeats nothing (as job_io.follow,
which cluster mode uses instead, through own_reads.py: a multi-key XREAD must stay in one slot). Several
requests may follow one stream (one X-Request-Id sent again while the first is answered): the stream is
read from the earliest of their last ids, and each is handed only the entries after its own.

Nothing an entry holds may stop the reader (it serves every stream of the process): an entry that is not
an event ends its own answer (job_io.until_terminal). Should the reader stop all the same, every request
gets HUB_STOPPED and /health fails.

Each request takes its stream's batches of events through a queue of its own (`follow`). After handing
out one reply's events the reader yields to the loop, so those requests go on before it parses the next
reply: otherwise a reply that arrived meanwhile is parsed first and they wait behind it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any

import redis
import structlog

from worker.connection import Backoff
from worker.error_codes import ErrorCode
from worker.gateway.job_io import LOST, until_terminal
from worker.keys import Keys
from worker.protocol import TERMINAL, ErrorEvent, Event

WAKE_TTL_S = 60
log = structlog.get_logger("conveyor.gateway")
# What every request still following a stream gets when the reader stops on an error: a 500 at once,
# not a wait until its deadline (and /health fails: worker/gateway/health.py).
HUB_STOPPED = ErrorEvent(
    type="error", code=ErrorCode.INTERNAL.value, message="the gateway's stream reader stopped"
)


@dataclass(eq=False)
class _Listener:
    put: Callable[[list[Event] | None], None]  # its request's queue.put_nowait
    last: bytes = b"0"  # the last entry id handed to it


class StreamHub:
    def __init__(self, client, keys: Keys, block_ms: int) -> None:
        self.client, self.block_ms = client, block_ms
        self.wake_key = f"{keys.prefix}:gateway-wake:{uuid.uuid4().hex}"
        self._wake_bytes = self.wake_key.encode()
        # Output stream -> the requests following it: usually one; several for one X-Request-Id sent again
        # while its first request is still answered (each is handed every event, from the first).
        self._streams: dict[bytes, list[_Listener]] = {}
        self._wake_last = b"$"
        self._reading = False  # an XREAD is in flight: a newcomer is not in it
        self._woken = False  # ... and a wake note was sent during it
        self._joined = asyncio.Event()
        self._closed = False
        self._stopped = False  # the reader ended on an error: nobody hands events out
        self._read_from: dict[bytes, bytes] = {}  # the id each stream of the last XREAD was read from

    def followed(self, keys: Keys, job_id: str) -> bool:
        """Whether a request still follows the job (another one with the same X-Request-Id)."""
        return bool(self._streams.get(keys.out(job_id).encode()))

    async def follow(self, keys: Keys, job_id: str, deadline: float) -> AsyncGenerator[list[Event], None]:
        """The job's events in order, from its first, in the batches the reads returned (from the next
        read on), ending with the batch holding the terminal event; TimeoutError at `deadline` (loop
        time)."""
        queue: asyncio.Queue[list[Event] | None] = asyncio.Queue()
        key = keys.out(job_id).encode()
        listener = _Listener(queue.put_nowait)
        # At the deadline a None joins the queue: one timer per request, not one per event (wait_for).
        timer = asyncio.get_running_loop().call_at(deadline, queue.put_nowait, None)
        try:
            if self._stopped:
                yield [HUB_STOPPED]
                return
            self._streams.setdefault(key, []).append(listener)
            self._joined.set()
            await self._wake()
            while True:
                batch = await queue.get()
                if batch is None:
                    raise TimeoutError(job_id)
                yield batch
                if batch[-1].type in TERMINAL:
                    return
        finally:
            timer.cancel()
            listeners = self._streams.get(key, [])
            if listener in listeners:
                listeners.remove(listener)
            if not listeners:
                self._streams.pop(key, None)

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
        """The reader: runs as long as the app (app.state.starters); stops when cancelled or closed. Should
        it fail (Redis refuses the gateway's password), every request following a stream gets HUB_STOPPED,
        as does every later one, and the task ends with the error (/health reports it)."""
        try:
            await self._read()
        except Exception:
            log.exception("the stream hub stopped: no output stream is read")
            self._stopped = True
            streams, self._streams = self._streams, {}
            for listeners in streams.values():
                for listener in listeners:
                    listener.put([HUB_STOPPED])
            raise

    async def _read(self) -> None:
        backoff = Backoff()
        while not self._closed:
            if not self._streams:
                self._joined.clear()
                await self._joined.wait()
                continue  # closed meanwhile, or someone joined
            self._read_from = {
                key: min((listener.last for listener in listeners), key=_order)
                for key, listeners in self._streams.items()
            }
            streams: dict[Any, bytes] = {self.wake_key: self._wake_last, **self._read_from}
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
        """Each stream's events to its requests' queues; whether any request got some."""
        handed = False
        for key, entries in reply:
            key = key if isinstance(key, bytes) else key.encode()
            if key == self._wake_bytes:
                self._wake_last = entries[-1][0]
                continue
            listeners = self._streams.get(key)
            if not listeners:  # its requests ended meanwhile
                continue
            start = _order(self._read_from.get(key, b"0"))
            for listener in list(listeners):
                if _order(listener.last) < start:  # joined during the read: the next one starts at its id
                    continue
                new = _after(entries, listener.last)  # read from its listeners' earliest last id
                if not new:
                    continue
                listener.last = new[-1][0]
                handed = True
                batch = until_terminal(new)
                listener.put(batch)
                if batch[-1].type in TERMINAL:
                    listeners.remove(listener)
            if not listeners and self._streams.get(key) is listeners:
                del self._streams[key]
        return handed


def _order(entry_id: bytes) -> tuple[int, int]:
    ms, _, seq = entry_id.partition(b"-")
    return int(ms), int(seq or 0)


def _after(entries: list, last: bytes) -> list:
    """The entries after id `last` (entries are in id order: most often all of them, told by the first)."""
    floor = _order(last)
    if _order(entries[0][0]) > floor:
        return entries
    return [entry for entry in entries if _order(entry[0]) > floor]


def _raise_if_cancel_lost() -> None:
    """A cancel that lands while redis-py writes the XREAD is swallowed there: the write runs under
    asyncio.wait_for (a socket timeout is set), and Python 3.10 and 3.11's wait_for returns a finished
    write's result instead of the cancel, so the read blocks and returns its reply as if nothing had been
    cancelled. Python 3.11 counts the cancel all the same (Task.cancelling); 3.10 cannot tell, and there
    the reader stops when closed."""
    cancelling = getattr(asyncio.current_task(), "cancelling", None)
    if cancelling is not None and cancelling() > 0:
        raise asyncio.CancelledError

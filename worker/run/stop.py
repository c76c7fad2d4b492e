"""Stopping a worker: the first signal asks for a warm stop (drain), the second for a cold one (exit now).

Signal handlers only call `request()`. Everything that waits (back-off after a Redis error, an idle loop)
waits on `sleep()`, which wakes at once when a stop is asked for, so a stop is bounded by the drain timeout
even while Redis is unreachable or full. A read that hangs on a frozen network (no error, no reply) does
not wait on `sleep()`: `grace_s` after the drain time runs out (at once at a cold stop) the `on_expired`
callbacks run on a timer thread, and the worker's one cuts its Redis sockets (worker.wire.exchange.cut_off).
The grace is for a loop that is not stuck: it sees the drain time run out at its next tick, forgets the
callback and writes its last round (releases, refunds), bounded on its own (LaneRun._last_write). Cut at
the drain time itself, the sockets went in the middle of that tick, and the last round with them (a
drained job's attempt was not refunded, seen in a loaded CI run: tests/worker/run/test_flow_fake.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from worker.connection import StopRequested

__all__ = ["CUT_GRACE_S", "StopFlag", "StopRequested"]

CUT_GRACE_S = 1.0  # past the drain time, before a stuck loop's sockets are cut (see the module docstring)


class StopFlag:
    def __init__(self, drain_timeout_s: float = 30.0, grace_s: float = CUT_GRACE_S) -> None:
        self.drain_timeout_s, self.grace_s = drain_timeout_s, grace_s
        self.warm = threading.Event()
        self.cold = threading.Event()
        self.drain_deadline: float | None = None  # time.monotonic() when a warm stop turns cold
        self._on_expired: list[Callable[[], None]] = []
        self._fired = threading.Event()
        self._lock = threading.Lock()  # a callback forgotten is not called after, nor while, forget returns

    def on_expired(self, callback: Callable[[], None]) -> None:
        """Call `callback` (on a timer thread) once the stop is cold or `grace_s` after its drain time."""
        self._on_expired.append(callback)

    def forget(self, callback: Callable[[], None]) -> None:
        """Do not call `callback` after all (its worker has stopped: its client may live on elsewhere)."""
        with self._lock:
            if callback in self._on_expired:
                self._on_expired.remove(callback)

    def request(self) -> None:
        if self.warm.is_set():
            self.cold.set()
            self._expire()
            return
        self.drain_deadline = time.monotonic() + self.drain_timeout_s
        self.warm.set()
        timer = threading.Timer(self.drain_timeout_s + self.grace_s, self._expire)
        timer.daemon = True
        timer.start()

    def _expire(self) -> None:
        with self._lock:
            if self._fired.is_set():
                return
            self._fired.set()
            for callback in list(self._on_expired):
                callback()

    def expired(self) -> bool:
        """A cold stop, or a warm one whose drain time is over: stop waiting for Redis."""
        if self.cold.is_set():
            return True
        return self.drain_deadline is not None and time.monotonic() >= self.drain_deadline

    def sleep(self, seconds: float) -> None:
        """Sleep up to `seconds`; return early on a new stop request or when the drain time runs out."""
        end = time.monotonic() + seconds
        if not self.warm.is_set():
            self.warm.wait(seconds)  # a first signal wakes the sleeper
        while not self.expired() and (left := end - time.monotonic()) > 0:
            deadline_left = (self.drain_deadline or end) - time.monotonic()
            self.cold.wait(max(0.0, min(left, deadline_left)))


class IdleStop:
    """A StopFlag seen by a worker with nothing to drain: any stop request ends the wait."""

    def __init__(self, flag: StopFlag) -> None:
        self.flag = flag

    def expired(self) -> bool:
        return self.flag.warm.is_set()

    def sleep(self, seconds: float) -> None:
        self.flag.sleep(seconds)

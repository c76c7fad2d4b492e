"""A last resort against a step that never returns.

gloo fails a collective after the group timeout, and at once when a peer's sockets close. NCCL may instead
block forever on a dead peer, and Python cannot interrupt a thread inside a C++ call. So a thread watches
how long the current step has run; past `limit_s` it calls `on_expire` (by default: log and end the process
with EXIT_CODE, so a worker's leases lapse and other workers take its jobs over, instead of a silent hang).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

EXIT_CODE = 70  # EX_SOFTWARE


def exit_process(message: str) -> None:
    print(f"conveyor: {message}; exiting", file=sys.stderr, flush=True)
    os._exit(EXIT_CODE)


class StepWatchdog:
    def __init__(
        self, limit_s: float, on_expire: Callable[[str], None] = exit_process, poll_s: float = 1.0
    ) -> None:
        self.limit_s, self.on_expire, self.poll_s = limit_s, on_expire, poll_s
        self._since: float | None = None  # monotonic start of the step in progress
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="conveyor-tp-watchdog", daemon=True)
        self._thread.start()

    @contextmanager
    def step(self) -> Iterator[None]:
        self._since = time.monotonic()
        try:
            yield
        finally:
            self._since = None

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            since = self._since
            if since is not None and time.monotonic() - since > self.limit_s:
                self.on_expire(f"a tensor-parallel step has not returned after {self.limit_s:.0f}s")
                return

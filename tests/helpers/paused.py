"""Freeze a process (SIGSTOP) for the length of a block, so a test can make something happen while a worker
cannot move on: an outcome that would otherwise depend on which of two processes is faster."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused(pid: int) -> Iterator[None]:
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)

"""Tests wait on a condition, never a fixed sleep: poll until it holds or fail naming what was awaited."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout_s: float, what: str, interval_s: float = 0.01) -> T:
    """Poll `predicate` until it returns something true (returned), or fail naming `what` after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)
    return value

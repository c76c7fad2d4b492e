"""StopFlag: when the drain's cut-off runs (worker/run/stop.py), and that a forgotten one does not."""

from __future__ import annotations

import threading
import time

from worker.run.stop import StopFlag


def test_the_cut_off_waits_a_grace_past_the_drain_time():
    """The loop sees the drain time itself; the sockets are cut only if it is still stuck a grace later."""
    flag = StopFlag(drain_timeout_s=0.05, grace_s=0.4)
    fired = threading.Event()
    flag.on_expired(fired.set)
    flag.request()
    time.sleep(0.15)
    assert flag.expired() and not fired.is_set()
    assert fired.wait(2.0)


def test_a_forgotten_cut_off_is_not_called():
    flag = StopFlag(drain_timeout_s=0.01, grace_s=0.05)
    fired = threading.Event()
    flag.on_expired(fired.set)
    flag.request()
    flag.forget(fired.set)
    assert not fired.wait(0.3)


def test_a_second_request_cuts_off_at_once():
    flag = StopFlag(drain_timeout_s=30.0)
    fired = threading.Event()
    flag.on_expired(fired.set)
    flag.request()
    flag.request()
    assert flag.cold.is_set() and fired.is_set()

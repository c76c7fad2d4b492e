"""StepWatchdog: a step that never returns ends the process (NCCL can block forever on a dead peer)."""

from __future__ import annotations

import threading

from engine.distributed.step_watchdog import StepWatchdog


def test_a_step_past_its_limit_fires_the_watchdog():
    fired = threading.Event()
    messages: list[str] = []

    def expire(message: str) -> None:
        messages.append(message)
        fired.set()

    dog = StepWatchdog(0.05, on_expire=expire, poll_s=0.01)
    with dog.step():
        assert fired.wait(10)  # the step is "stuck" until the watchdog has fired
    assert "has not returned" in messages[0]


def test_steps_that_return_and_idle_time_never_fire_it():
    fired = threading.Event()
    dog = StepWatchdog(0.2, on_expire=lambda _m: fired.set(), poll_s=0.01)
    for _ in range(3):
        with dog.step():
            pass
    # Idle (no step in progress) far longer than the limit: nothing fires.
    assert not fired.wait(0.6)
    dog.stop()

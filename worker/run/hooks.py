"""What tests and benchmarks may watch of the loop, behind one object production does not pay for.

The Worker holds one `Hooks` (the no-op `NO_HOOKS` unless given another) and calls it at two points: after
each engine step, with the step's deltas, and when a round that carried token events is answered. A
`Tracer` (benchmarks) keeps every token event and publish latency; `KillOnJob` (worker/run/
fault_injection.py, tests only) crashes the process. The loop never reads anything back.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

from engine.outputs import StepDelta


class Hooks:
    """No-ops: what a production worker runs."""

    def stepped(self, deltas: list[StepDelta], sampled_wall_s: float) -> None:
        """After an engine step (deltas empty when the tick did not step)."""

    def published(self, latency_s: float) -> None:
        """Token sampled -> its round's EXEC reply read."""


NO_HOOKS = Hooks()


class TokenTrace(NamedTuple):
    job_id: str
    sample: int
    first_index: int  # of the event's first token in its sample
    sampled_wall_s: float  # time.time() when the step that sampled it returned


class Tracer(Hooks):
    """For benchmarks: keeps every token event's trace and every publish latency."""

    def __init__(self) -> None:
        self.trace: list[TokenTrace] = []
        self.publish_latencies: deque[float] = deque(maxlen=100_000)  # seconds

    def stepped(self, deltas: list[StepDelta], sampled_wall_s: float) -> None:
        for d in deltas:
            if d.new_token_ids or d.text_delta:
                self.trace.append(TokenTrace(d.request_id, d.sample_index, d.first_index, sampled_wall_s))

    def published(self, latency_s: float) -> None:
        self.publish_latencies.append(latency_s)

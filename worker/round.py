"""One round trip to Redis per engine step: every command of the step in a single MULTI/EXEC pipeline.

Commands are recorded as closures with an optional result handler, so a round that failed on a dropped
connection can be replayed on a fresh pipeline. Handlers run later, on the loop's thread (`dispatch`).
MULTI/EXEC makes each step's events, lease renewals and acknowledgements land together or not at all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis
from redis.client import Pipeline

Command = Callable[[Pipeline], Any]
Handler = Callable[[Any], None]


class Round:
    def __init__(self) -> None:
        self.commands: list[Command] = []
        self.handlers: list[Handler | None] = []
        # True once a try failed mid-flight: an earlier try may have executed, so handlers must accept
        # "already written" answers (see publish.py).
        self.retried = False
        # time.perf_counter() when the newest token events in this round were sampled (for latency).
        self.sampled_at: float | None = None

    def add(self, command: Command, on_result: Handler | None = None) -> None:
        self.commands.append(command)
        self.handlers.append(on_result)

    def __len__(self) -> int:
        return len(self.commands)

    def execute(self, client: redis.Redis) -> list[Any]:
        pipe = client.pipeline(transaction=True)
        for command in self.commands:
            command(pipe)
        try:
            # Per-command errors (a wrong-type key a client created, an id conflict) come back as values,
            # so one bad key cannot fail the whole step.
            return pipe.execute(raise_on_error=False)
        except BaseException:
            self.retried = True
            raise

    def dispatch(self, results: list[Any]) -> None:
        for handler, result in zip(self.handlers, results, strict=True):
            if handler is not None:
                handler(result)

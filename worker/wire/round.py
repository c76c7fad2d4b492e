"""One round trip to Redis per engine step: every command of the step in a single MULTI/EXEC.

Commands are recorded, not sent, as they are added: `add(lambda p: p.xadd(...))` runs redis-py's argument
building against a `Recorder`, and hot paths add ready argument tuples with `raw(...)`. MULTI/EXEC makes
each step's events, lease renewals and acknowledgements land together or not at all.

Each command may name who takes its reply: a handler called with that reply alone, or, for a group of
commands (`add_group`, one job's lookups), with the group's replies together. A handler records what the
reply means (a job's next stage, a script to load again); it never writes into another round. What is
owed to Redis after a reply is kept by its owner and added when the loop builds the next round.

exchange.py sends rounds and reads their replies (on the loop's I/O thread, while the engine steps);
`dispatch` hands the replies to their handlers on the loop's thread. A round that failed on a dropped
connection is sent again whole (`retried` tells handlers so).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from redis.commands.core import CoreCommands

# Called with one command's reply (an exception value when Redis refused that command).
Handler = Callable[[Any], None]
# Called with the replies of a group of commands, in the order they were added.
GroupHandler = Callable[[list[Any]], None]


class Command(NamedTuple):
    args: tuple
    options: dict


class Recorder(CoreCommands):
    """redis-py's command methods (xadd, set, xautoclaim...) writing into a list instead of a socket."""

    def __init__(self, stack: list) -> None:
        self.stack = stack

    def execute_command(self, *args, **options):
        self.stack.append(Command(args, options))


class Round:
    def __init__(self) -> None:
        self.stack: list[Command] = []
        self.handlers: list[Handler | None] = []
        self.groups: list[tuple[int, int, GroupHandler]] = []  # (first command, end, handler)
        # CoreCommands declares a client's event dispatcher abstract; a Recorder never dispatches events.
        self._recorder = Recorder(self.stack)  # type: ignore[abstract]
        self.retried = False  # an earlier try may have been applied (see publish/publisher.py)
        # Answered before the engine steps (it counts an attempt: job_path.py); else it overlaps the step.
        self.before_step = False
        # time.perf_counter() when the newest token events in this round were sampled, and when Redis's
        # EXEC reply was read (written and readable by then): the publish latency.
        self.sampled_at: float | None = None
        self.answered_at: float | None = None

    # `command` gets a Recorder typed Any: redis-py 8 types its command methods for a connected client only.
    def add(self, command: Callable[[Any], Any], on_result: Handler | None = None) -> None:
        command(self._recorder)
        self.handlers.append(on_result)

    def raw(self, args: tuple, on_result: Handler | None = None) -> None:
        self.stack.append(Command(args, {}))
        self.handlers.append(on_result)

    def add_group(self, commands: list[Callable[[Any], Any]], on_results: GroupHandler) -> None:
        """Several commands whose replies go to one handler together."""
        first = len(self.stack)
        for command in commands:
            self.add(command)
        self.groups.append((first, len(self.stack), on_results))

    def __len__(self) -> int:
        return len(self.stack)

    def dispatch(self, results: list[Any]) -> None:
        """Hand each reply to its handler, and a group's replies to the group's, in the order added."""
        ends = {end - 1: (first, on_results) for first, end, on_results in self.groups}
        for k, (handler, result) in enumerate(zip(self.handlers, results, strict=True)):
            if handler is not None:
                handler(result)
            if k in ends:
                first, on_results = ends[k]
                on_results(results[first : k + 1])

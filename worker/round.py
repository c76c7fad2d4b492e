"""One round trip to Redis per engine step: every command of the step in a single MULTI/EXEC.

Commands are recorded, not sent, as they are added: `add(lambda p: p.xadd(...))` runs redis-py's argument
building against a `Recorder`, and hot paths add ready argument tuples with `raw(...)`. MULTI/EXEC makes
each step's events, lease renewals and acknowledgements land together or not at all.

A round is split in two so the network overlaps the engine's step: `send` (loop thread: pack and write
everything; Redis applies it while the engine computes) and `receive` (I/O thread: read the replies and
apply redis-py's reply parsers). Handlers run later, on the loop's thread (`dispatch`). A round that
failed on a dropped connection is sent again whole (`retried` tells handlers so).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import redis
from redis.commands.core import CoreCommands

try:  # hiredis packs a command in C; redis-py's own packer is the fallback
    from hiredis import pack_command
except ImportError:  # pragma: no cover
    pack_command = None  # type: ignore[assignment]

# Called with the command's reply and the round being built next, where it writes any follow-up commands.
Handler = Callable[[Any, "Round"], None]


class Command(NamedTuple):
    args: tuple
    options: dict


_MULTI, _EXEC = ("MULTI",), ("EXEC",)


class Recorder(CoreCommands):
    """redis-py's command methods (xadd, set, xautoclaim...) writing into a list instead of a socket."""

    def __init__(self, stack: list) -> None:
        self.stack = stack

    def execute_command(self, *args, **options):
        self.stack.append(Command(args, options))


@dataclass
class Sent:
    client: redis.Redis
    connection: Any


class Round:
    def __init__(self) -> None:
        self.stack: list[Command] = []
        self.handlers: list[Handler | None] = []
        # CoreCommands declares a client's event dispatcher abstract; a Recorder never dispatches events.
        self._recorder = Recorder(self.stack)  # type: ignore[abstract]
        self.retried = False  # an earlier try may have been applied (see publish.py)
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

    def __len__(self) -> int:
        return len(self.stack)

    def execute(self, client: redis.Redis) -> list[Any]:
        return self.receive(self.send(client))

    def send(self, client: redis.Redis) -> Sent:
        connection = client.connection_pool.get_connection()
        try:
            connection.send_packed_command(self.packed(connection))
        except BaseException:
            self._fail(client, connection)
            raise
        return Sent(client, connection)

    def packed(self, connection) -> list[bytes]:
        """MULTI, the commands, EXEC: the chunks to write to `connection`. Several rounds' chunks may share
        one write to one connection (worker/cluster/node_rounds.py): each stays its own transaction."""
        commands = [_MULTI, *(_split_name(args) for args, _ in self.stack), _EXEC]
        if pack_command is not None:
            return [b"".join(map(pack_command, commands))]
        return connection.pack_commands(commands)

    def receive(self, sent: Sent) -> list[Any]:
        """The replies, one per command. Per-command errors (a wrong-type key a client created, an id
        conflict) come back as exception values, so one bad key cannot fail the whole step."""
        client, connection = sent.client, sent.connection
        try:
            results = self.read(connection, client.response_callbacks)
        except BaseException:
            self._fail(client, connection)
            raise
        client.connection_pool.release(connection)
        return results

    def read(self, connection, callbacks) -> list[Any]:
        """Read this round's replies from `connection` and parse them with redis-py's `callbacks`. When
        EXEC was refused (nothing ran) the error is raised after EXEC's reply was read; any other error
        leaves the connection in an unknown state."""
        connection.read_response()  # +OK for MULTI
        queued: list[redis.ResponseError | None] = []
        for _ in self.stack:
            try:
                connection.read_response()  # +QUEUED
                queued.append(None)
            except redis.ResponseError as exc:  # refused before running (e.g. wrong arity)
                queued.append(exc)
        try:
            replies = connection.read_response()
            self.answered_at = time.perf_counter()
        except redis.exceptions.ExecAbortError as abort:
            # Nothing ran. The first refusal says why (OOM: Redis is full); the abort stays its cause.
            raise next((e for e in queued if e is not None), abort) from abort
        results = []
        for (args, options), reply in zip(self.stack, replies, strict=True):
            name = args[0]
            if not isinstance(reply, Exception) and name in callbacks:
                if "keys" in options:
                    options = {k: v for k, v in options.items() if k != "keys"}
                reply = callbacks[name](reply, **options)
            results.append(reply)
        return results

    def _fail(self, client: redis.Redis, connection) -> None:
        self.retried = True
        connection.disconnect()
        client.connection_pool.release(connection)

    def dispatch(self, results: list[Any], into: Round) -> None:
        """Hand each reply to its handler; what they write goes into `into`, the round built next."""
        for handler, result in zip(self.handlers, results, strict=True):
            if handler is not None:
                handler(result, into)


def _split_name(args: tuple) -> tuple:
    """redis-py names some commands in two words ("XINFO GROUPS"); the wire wants two arguments."""
    name = args[0]
    return (*name.split(), *args[1:]) if isinstance(name, str) and " " in name else args

"""Rounds on the wire: one write per node and step, replies read back.

A round (round.py) is a list of recorded commands. `exchange` writes one or more rounds to one Redis
node in one write, each round framed as its own MULTI ... EXEC, and reads every reply back:

    one write:  MULTI  cmd_1 .. cmd_n  EXEC   [MULTI .. EXEC  for each further round on this node]
    replies:    +OK    +QUEUED x n     [reply_1 .. reply_n]   ...

Command names go out as bytes, and redis-py's reply callbacks (looked up by the name as a string) are
applied here, once, to the replies inside EXEC's array, never to a +QUEUED. Per-command errors stay
values. `exchange` is the fast path, below redis-py's public API (a pooled connection's
`send_packed_command` / `read_response`, packed by hiredis), where redis-py's public pipeline would
pack every command in Python. `cut_off` (the drain
bound on a frozen network) reaches below it too: redis-py lists no pool's connections.

A worker's client must not re-send a round on its own: a round whose reply was lost may have been
applied, and only the worker knows how to tolerate that (`Round.retried`, publish/publisher.py).
`no_resends` turns redis-py's own retries off for such a client; the worker retries with back-off
(connection.py). Runs on the loop's I/O thread, so the network overlaps the engine's step (run/loop.py).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Sequence
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from worker.wire.round import Round

try:  # hiredis packs a command in C; redis-py's own packer is the fallback
    from hiredis import pack_command
except ImportError:  # pragma: no cover
    pack_command = None  # type: ignore[assignment]

_MULTI, _EXEC = (b"MULTI",), (b"EXEC",)


def no_resends(client: redis.Redis) -> redis.Redis:
    """Turn off redis-py's retries on `client` (its pool's connections too): an error reaches the worker."""
    client.set_retry(Retry(NoBackoff(), 0))
    return client


def execute(client: redis.Redis, rnd: Round) -> list[Any]:
    """Send one round and return its replies; raises what failed it (see `exchange`)."""
    (outcome,) = exchange(client, [rnd])
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


def execute_plain(client: redis.Redis, rnd: Round) -> list[Any]:
    """Send one round's commands without MULTI (for blocking reads, which MULTI would not let block)."""
    pipe = client.pipeline(transaction=False)
    for args, options in rnd.stack:
        pipe.execute_command(*args, **options)
    return pipe.execute(raise_on_error=False)


def exchange(client: redis.Redis, rounds: Sequence[Round]) -> list[list[Any] | BaseException]:
    """Per round, its replies (one per command) or the error that failed it:
    - EXEC refused (nothing of the round ran): the first command refused at queue time (OOM when Redis
      is full), with the abort as its cause;
    - the connection broke: that error, for every round (each marked `retried`: it may have been applied).
    Empty rounds are answered [] without being sent.

    The fast path (see the module's docstring): one connection from the client's pool, the rounds packed
    by hiredis in one write, each reply read with `read_response`."""
    sent = [rnd for rnd in rounds if len(rnd)]
    if not sent:
        return [[] for _ in rounds]
    pool = client.connection_pool
    try:
        connection = pool.get_connection()
    except BaseException as exc:
        return _failed(rounds, sent, exc)
    try:
        connection.send_packed_command(_packed(sent, connection))
        replies: list[Any] = []
        for _ in range(sum(len(rnd) + 2 for rnd in sent)):
            try:
                replies.append(connection.read_response())
            except redis.ResponseError as refused:  # an error reply, as a value (the stream stays in step)
                replies.append(refused)
    except BaseException as exc:
        connection.disconnect()
        pool.release(connection)
        return _failed(rounds, sent, exc)
    pool.release(connection)
    return _outcomes(client, rounds, sent, replies)


def _failed(
    rounds: Sequence[Round], sent: list[Round], exc: BaseException
) -> list[list[Any] | BaseException]:
    for rnd in sent:
        rnd.retried = True
    return [exc if len(rnd) else [] for rnd in rounds]


def _outcomes(client, rounds: Sequence[Round], sent: list[Round], replies: list[Any]) -> list:
    answered = time.perf_counter()
    outcomes: dict[int, list[Any] | BaseException] = {}
    at = 0
    for rnd in sent:
        framed = replies[at : at + len(rnd) + 2]
        at += len(rnd) + 2
        rnd.answered_at = answered
        outcomes[id(rnd)] = _settle(rnd, framed, client.response_callbacks)
    return [outcomes[id(rnd)] if len(rnd) else [] for rnd in rounds]


def _packed(rounds: list[Round], connection) -> list[bytes]:
    """MULTI, the commands, EXEC for each round: the bytes of one write."""
    commands: list[tuple] = []
    for rnd in rounds:
        commands += [_MULTI, *(wire_command(args) for args, _ in rnd.stack), _EXEC]
    if pack_command is not None:
        return [b"".join(map(pack_command, commands))]
    return connection.pack_commands(commands)


def _settle(rnd: Round, framed: list[Any], callbacks) -> list[Any] | BaseException:
    """[MULTI's reply, one +QUEUED or refusal per command, EXEC's reply] -> the commands' parsed replies."""
    queued, replies = framed[1:-1], framed[-1]
    if isinstance(framed[0], BaseException):  # MULTI refused (an ACL without it): say why, as is
        rnd.retried = True
        return framed[0]
    if isinstance(replies, BaseException):
        rnd.retried = True  # EXEC aborted: nothing ran, but say so to whoever resends it
        refused = next((r for r in queued if isinstance(r, BaseException)), None)
        if refused is None:
            return replies
        refused.__cause__ = replies
        return refused
    results = []
    for (args, options), reply in zip(rnd.stack, replies, strict=True):
        name = args[0]
        if not isinstance(reply, Exception) and name in callbacks:
            reply = callbacks[name](reply, **{k: v for k, v in options.items() if k != "keys"})
        results.append(reply)
    return results


def wire_command(args: tuple) -> tuple:
    """The command as sent: its name in bytes (see the module's docstring), split when redis-py names it in
    two words ("XINFO GROUPS"), as redis-py's own packer splits it (also async_packing.py)."""
    name = args[0]
    words = name.encode().split() if isinstance(name, str) else name.split()
    return (*words, *args[1:])


def cut_off(client) -> None:
    """Shut down every socket of `client` (plain or cluster), in use or idle, from any thread. A thread
    blocked reading one (a frozen network answers nothing, for up to the socket timeout) gets end of file
    at once and redis-py raises ConnectionError there; that thread then closes the connection itself.
    (`disconnect()` from here would clear the connection's socket under the reading thread.)"""
    pools = [client.connection_pool] if hasattr(client, "connection_pool") else []
    if hasattr(client, "get_nodes"):  # redis.RedisCluster: one pool per node
        pools += [n.redis_connection.connection_pool for n in client.get_nodes() if n.redis_connection]
    for pool in pools:
        # redis-py keeps no public list of a pool's connections (these take the pool's lock).
        connections = [*pool._get_free_connections(), *pool._get_in_use_connections()]
        for connection in connections:
            sock = getattr(connection, "_sock", None)
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

"""One round trip per Redis node for a cycle's rounds, instead of one per shard.

In a cycle every shard's Worker builds its step's round (one MULTI/EXEC on its shard's slot). Shards whose
slots are on the same master go out together: their rounds' bytes in one write on one connection, the
replies read back in order on an I/O thread. Each round stays its own MULTI/EXEC, so a shard's writes are
as atomic as before; only the number of writes, reads and wake-ups on each node goes down (with 8 shards
on 3 masters: 3 round trips a cycle, not 8).

    node A:  MULTI ..shard 0.. EXEC MULTI ..shard 3.. EXEC MULTI ..shard 6.. EXEC   (one write)
    node B:  MULTI ..shard 1.. EXEC MULTI ..shard 4.. EXEC ...

Failures are the shard's own business, as on one Redis: a round whose EXEC was refused (OOM, MOVED) gets
that error and the rounds after it are read on; a write or read that breaks the connection fails that
round and every later one on it, marked `retried` (they may have been applied). Each worker then sends
its round again through its own shard client (Worker.finish), which follows a failover (connect.py).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import redis

from worker.cluster.connect import MasterPool
from worker.connection import DOWN_ERRORS
from worker.round import Round


class NodeRounds:
    def __init__(self) -> None:
        self.io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="conveyor-node-io")
        self.writes = 0  # round trips made (one per node per cycle): for tests and benchmarks

    def send(self, rounds: list[tuple[redis.Redis, Round]]) -> list[Future | None]:
        """Send each (shard client, round); returns per round a Future of its replies (None for an empty
        round). Rounds of clients on the same node share one write."""
        futures: list[Future | None] = [None] * len(rounds)
        by_node: dict[tuple, list[tuple[redis.Redis, Round, Future]]] = {}
        for i, (client, rnd) in enumerate(rounds):
            if len(rnd):
                future: Future = Future()
                futures[i] = future
                by_node.setdefault(_address(client), []).append((client, rnd, future))
        for group in by_node.values():
            self._send_group(group)
        return futures

    def _send_group(self, group: list[tuple[redis.Redis, Round, Future]]) -> None:
        client = group[0][0]  # any shard's pool on this node will do: they point at the same master
        pool = client.connection_pool
        try:
            connection = pool.get_connection()
        except DOWN_ERRORS as exc:
            _fail_all(group, exc)
            return
        try:
            connection.send_packed_command([chunk for _, rnd, _ in group for chunk in rnd.packed(connection)])
        except BaseException as exc:
            connection.disconnect()
            pool.release(connection)
            _fail_all(group, exc)
            if not isinstance(exc, DOWN_ERRORS):
                raise
            return
        self.writes += 1
        self.io.submit(_receive, group, pool, connection)

    def close(self) -> None:
        self.io.shutdown(wait=True)


def _address(client: redis.Redis) -> tuple:
    pool = client.connection_pool
    assert isinstance(pool, MasterPool)
    return pool.connection_kwargs["host"], pool.connection_kwargs["port"]


def _receive(group: list[tuple[redis.Redis, Round, Future]], pool, connection) -> None:
    """Read each round's replies in order (on the I/O thread), give the connection back, then settle the
    Futures (so the loop's next cycle finds the connection free)."""
    outcomes: list[tuple[bool, object]] = []
    broken: BaseException | None = None
    for client, rnd, _ in group:
        if broken is not None:
            rnd.retried = True
            outcomes.append(
                (False, redis.ConnectionError(f"an earlier round on this connection failed: {broken}"))
            )
            continue
        try:
            outcomes.append((True, rnd.read(connection, client.response_callbacks)))
        except BaseException as exc:
            rnd.retried = True
            if not _exec_refused(exc):  # the connection's state is unknown: nothing more is read on it
                broken = exc
            outcomes.append((False, exc))
    if broken is not None:
        connection.disconnect()
    pool.release(connection)
    for (_, _, future), (ok, value) in zip(group, outcomes, strict=True):
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)  # type: ignore[arg-type]


def _exec_refused(exc: BaseException) -> bool:
    """EXEC answered with an abort (Round.read raises it, or the refusal that caused it, once EXEC's reply
    was read): the connection is still in step."""
    return isinstance(exc, redis.exceptions.ExecAbortError) or isinstance(
        exc.__cause__, redis.exceptions.ExecAbortError
    )


def _fail_all(group: list[tuple[redis.Redis, Round, Future]], exc: BaseException) -> None:
    for _, rnd, future in group:
        rnd.retried = True
        future.set_exception(exc)

"""One round trip per Redis node for a tick's rounds, instead of one per lane (run/loop.py).

In a cycle every lane's Worker builds its step's round (in a cluster, one MULTI/EXEC on its shard's slot).
Lanes on the same Redis (every lane, on one Redis; in a cluster, shards whose slots share a master) go
out together: their rounds' bytes in one write on one connection, the
replies read back in order on an I/O thread. Each round stays its own MULTI/EXEC, so a shard's writes are
as atomic as before; only the number of writes, reads and wake-ups on each node goes down (with 8 shards
on 3 masters: 3 round trips a cycle, not 8).

    node A:  MULTI ..shard 0.. EXEC MULTI ..shard 3.. EXEC MULTI ..shard 6.. EXEC   (one write)
    node B:  MULTI ..shard 1.. EXEC MULTI ..shard 4.. EXEC ...

Failures are the shard's own business, as on one Redis: a round whose EXEC was refused (OOM, MOVED) gets
that error and the other rounds are still answered; a write or read that breaks the connection fails
every round of that write, marked `retried` (they may have been applied). Each worker then sends its round
again through its own shard client (LaneRun.finish), which follows a failover (connect.py). The bytes go
through worker/wire/, on one I/O thread per node, so the nodes' round trips overlap.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import redis

from worker.wire.exchange import exchange
from worker.wire.round import Round

_MAX_NODES = 16  # I/O threads: one per node written to in a cycle (more nodes queue behind them)


class NodeRounds:
    def __init__(self) -> None:
        self.io = ThreadPoolExecutor(max_workers=_MAX_NODES, thread_name_prefix="conveyor-node-io")
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
            self.writes += 1
            self.io.submit(_exchange, group)
        return futures

    def close(self) -> None:
        self.io.shutdown(wait=True)


def _address(client: redis.Redis) -> tuple:
    kwargs = client.connection_pool.connection_kwargs
    return kwargs.get("host"), kwargs.get("port"), kwargs.get("path")


def _exchange(group: list[tuple[redis.Redis, Round, Future]]) -> None:
    """One write of the group's rounds on one node's connection (any shard's pool on this node will do:
    they point at the same master), then each round's Future settled."""
    try:
        outcomes = exchange(group[0][0], [rnd for _, rnd, _ in group])
    except BaseException as exc:  # not a Redis reply: fail the rounds rather than leave them waiting
        outcomes = [exc] * len(group)
    for (_, _, future), outcome in zip(group, outcomes, strict=True):
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)

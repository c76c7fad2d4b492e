"""A cycle's rounds go out with one write per master, each still its own MULTI/EXEC (node_rounds.py)."""

from __future__ import annotations

from collections import Counter

import pytest
import redis

from tests.cluster.conftest import SHARDS
from worker.cluster.connect import shard_client
from worker.run.node_rounds import NodeRounds
from worker.wire.round import Round

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(60)]


@pytest.fixture
def shard_clients(cluster, client):
    clients = [shard_client(client.cluster, client.sharded.shard(k).requests) for k in range(SHARDS)]
    yield clients
    for c in clients:
        c.close()


@pytest.fixture
def writes(monkeypatch) -> Counter:
    """(host, port) -> packed writes sent there."""
    sent: Counter = Counter()
    original = redis.connection.AbstractConnection.send_packed_command

    def counting(self, command, check_health=True):
        sent[(self.host, self.port)] += 1
        return original(self, command, check_health)

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counting)
    return sent


def test_one_write_per_master_and_each_shard_gets_its_own_replies(client, shard_clients, writes):
    rounds = []
    for k in range(SHARDS):
        rnd = Round()
        counter = client.sharded.shard(k).attempts
        rnd.raw(("HINCRBY", counter, "x", k + 1))
        rnd.add(lambda p, c=counter: p.hgetall(c))  # parsed by redis-py's reply callback: a dict
        rounds.append(rnd)
    for c in shard_clients:
        c.ping()  # connected beforehand: a new connection's handshake is writes of its own
    writes.clear()
    nodes = NodeRounds()
    try:
        futures = nodes.send([(c, r) for c, r in zip(shard_clients, rounds, strict=True)])
        results = [f.result(timeout=10) for f in futures]
    finally:
        nodes.close()
    assert results == [[k + 1, {b"x": str(k + 1).encode()}] for k in range(SHARDS)]
    masters = {address(c) for c in shard_clients}
    assert len(masters) == 3 and nodes.writes == 3
    assert {a: writes[a] for a in masters} == dict.fromkeys(masters, 1)  # 8 transactions, 3 writes


def address(c: redis.Redis) -> tuple:
    return c.connection_pool.connection_kwargs["host"], c.connection_pool.connection_kwargs["port"]


def test_a_refused_transaction_fails_alone(client, shard_clients):
    """A round whose EXEC is refused (a command with the wrong arity: nothing of it runs) gets its error;
    the rounds after it on the same connection still run."""
    on_node = Counter(address(c) for c in shard_clients)
    # 8 shards on 3 masters: some master holds two or more; fail the first of them.
    bad = next(k for k, c in enumerate(shard_clients) if on_node[address(c)] >= 2)
    rounds = []
    for k in range(SHARDS):
        rnd = Round()
        rnd.raw(("SET", client.sharded.shard(k).owner("j"), "w"))
        if k == bad:
            rnd.raw(("GET",))  # wrong number of arguments: refused at queue time, EXEC aborts
        rounds.append(rnd)
    nodes = NodeRounds()
    try:
        futures = nodes.send([(c, r) for c, r in zip(shard_clients, rounds, strict=True)])
        with pytest.raises(redis.ResponseError, match="wrong number of arguments"):
            futures[bad].result(timeout=10)
        others = [f.result(timeout=10) for k, f in enumerate(futures) if k != bad]
    finally:
        nodes.close()
    assert others == [[True]] * (SHARDS - 1) and rounds[bad].retried
    assert [shard_clients[k].get(client.sharded.shard(k).owner("j")) for k in range(SHARDS)] == [
        None if k == bad else b"w" for k in range(SHARDS)
    ]

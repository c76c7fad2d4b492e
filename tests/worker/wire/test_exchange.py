"""wire/exchange.py against a real redis-server: one test per reply shape a round can get back."""

from __future__ import annotations

import pytest
import redis
from redis.backoff import ConstantBackoff
from redis.retry import Retry

from worker import local_redis
from worker.connection import connect
from worker.wire.exchange import exchange, execute, execute_plain, no_resends
from worker.wire.round import Round

pytestmark = pytest.mark.redis


@pytest.fixture
def c(redis_server):
    client = no_resends(connect(redis_server.url))
    client.flushall()
    yield client
    client.close()


def test_replies_are_parsed_by_redis_py_callbacks_once(c):
    """HGETALL comes back a dict, SET a bool: the callbacks run on EXEC's replies, not on +QUEUED."""
    rnd = Round()
    rnd.raw(("HSET", "h", "f", "v"))
    rnd.add(lambda p: p.hgetall("h"))
    rnd.add(lambda p: p.set("k", "x", nx=True, get=True))  # SET ... GET: the old value, None
    rnd.add(lambda p: p.xadd("s", {"a": "b"}, id="0-1"))
    rnd.add(lambda p: p.xrange("s"))  # its callback would fail on a +QUEUED
    assert execute(c, rnd) == [1, {b"f": b"v"}, None, b"0-1", [(b"0-1", {b"a": b"b"})]]


def test_a_command_redis_refuses_while_running_is_a_value_and_the_rest_runs(c):
    c.set("str", "x")
    rnd = Round()
    rnd.add(lambda p: p.xadd("str", {"a": "b"}))  # WRONGTYPE, inside EXEC
    rnd.add(lambda p: p.set("after", "y"))
    got = execute(c, rnd)
    assert isinstance(got[0], redis.ResponseError) and "WRONGTYPE" in str(got[0]) and got[1] is True
    assert c.get("after") == b"y" and not rnd.retried


def test_a_command_refused_at_queue_time_fails_the_round_and_nothing_runs(c):
    rnd = Round()
    rnd.raw(("SET", "k", "v"))
    rnd.raw(("GET",))  # wrong arity: refused before EXEC, which then aborts
    with pytest.raises(redis.ResponseError, match="wrong number of arguments") as raised:
        execute(c, rnd)
    assert isinstance(raised.value.__cause__, redis.exceptions.ExecAbortError)
    assert c.get("k") is None and rnd.retried


def test_redis_full_is_an_out_of_memory_error_and_nothing_runs(c):
    c.config_set("maxmemory", 1)
    try:
        rnd = Round()
        rnd.raw(("SET", "k", "v"))
        with pytest.raises(redis.OutOfMemoryError):
            execute(c, rnd)
    finally:
        c.config_set("maxmemory", 0)
    assert c.get("k") is None


def test_two_rounds_in_one_write_are_two_transactions(c):
    first, empty, second = Round(), Round(), Round()
    first.raw(("INCR", "n"))
    second.raw(("INCR", "n"))
    second.raw(("GET",))  # the second round aborts alone
    got = exchange(c, [first, empty, second])
    assert got[0] == [1] and got[1] == [] and isinstance(got[2], redis.ResponseError)
    assert c.get("n") == b"1"


def test_two_word_commands_and_handlers(c):
    c.xgroup_create("s", "g", id="0", mkstream=True)
    seen: list = []
    rnd = Round()
    rnd.add(lambda p: p.xinfo_groups("s"), seen.append)
    rnd.add_group([lambda p: p.exists("s"), lambda p: p.exists("nothing")], seen.append)
    rnd.dispatch(execute(c, rnd))
    assert seen[0][0]["name"] == b"g" and seen[1] == [1, 0]


def test_blocking_reads_go_without_multi(c):
    c.xadd("s", {"a": "b"}, id="0-1")
    c.xgroup_create("s", "g", id="0")
    rnd = Round()
    rnd.add(lambda p: p.xreadgroup("g", "w", {"s": ">"}, count=5, block=10))
    ((stream, entries),) = execute_plain(c, rnd)[0]
    assert stream == b"s" and entries == [(b"0-1", {b"a": b"b"})]


def test_a_lost_server_fails_every_round_at_once_and_nothing_is_resent():
    server = local_redis.start()
    client = no_resends(connect(server.url, socket_timeout=2))
    try:
        client.ping()
        server.stop()
        rounds = [Round(), Round()]
        for rnd in rounds:
            rnd.raw(("INCR", "n"))
        got = exchange(client, rounds)
        assert all(isinstance(g, redis.ConnectionError) for g in got)
        assert all(rnd.retried for rnd in rounds)  # they may have been applied: the caller decides
    finally:
        client.close()
        server.stop()


_BUSY = """
local t0 = redis.call('TIME')
while true do
  local t = redis.call('TIME')
  if (t[1] - t0[1]) * 1000000 + (t[2] - t0[2]) > tonumber(ARGV[1]) then return 1 end
end
"""


def test_a_round_whose_reply_is_late_is_not_sent_again_behind_the_workers_back(redis_server):
    """The round ran, but its reply came after the socket timeout: redis-py must not re-send it (the INCR
    would run twice); the error reaches the worker, which knows the round may have landed. The client
    re-sends on its own, as `redis.Redis(host, port)` does by default, until `no_resends`."""
    resending = Retry(ConstantBackoff(0.7), 2)
    client = no_resends(redis.Redis.from_url(redis_server.url, socket_timeout=0.3, retry=resending))
    try:
        client.delete("n")
        rnd = Round()
        rnd.raw(("INCR", "n"))
        rnd.raw(("EVAL", _BUSY, 0, 600_000))  # Redis busy for 0.6 s: longer than the socket timeout
        (got,) = exchange(client, [rnd])
        assert isinstance(got, redis.TimeoutError) and rnd.retried
        assert redis.Redis.from_url(redis_server.url).get("n") == b"1"
    finally:
        client.close()


def test_replies_are_parsed_per_command_and_a_refused_round_is_its_error(c):
    good, bad = Round(), Round()
    good.add(lambda p: p.hset("h", mapping={"f": "v"}))
    good.add(lambda p: p.hgetall("h"))
    good.add(lambda p: p.xadd("s", {"a": "b"}, id="0-1"))
    good.add(lambda p: p.xrange("s"))
    bad.raw(("GET",))
    replies = exchange(c, [good, Round(), bad])
    assert replies[:2] == [[1, {b"f": b"v"}, b"0-1", [(b"0-1", {b"a": b"b"})]], []]
    assert isinstance(replies[2], redis.ResponseError) and "wrong number of arguments" in str(replies[2])

"""worker.client.events: reading a job's output stream across Redis restarts and socket timeouts."""

from __future__ import annotations

import json
import threading

import pytest
import redis

from worker import local_redis
from worker.client import events, read_block_ms
from worker.keys import EVENT_FIELD, Keys

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]
K = Keys()


def token(index: int) -> dict:
    return {"type": "token", "index": index, "token_ids": [index], "text": "t"}


def write(client: redis.Redis, seq: int, event: dict) -> None:
    client.xadd(K.out("j"), {EVENT_FIELD: json.dumps(event)}, id=f"0-{seq}")


def test_block_is_shorter_than_the_socket_timeout():
    assert read_block_ms(redis.Redis(socket_timeout=0.5)) < 500
    assert read_block_ms(redis.Redis()) < 5000  # redis-py 8's default socket timeout is 5 s
    assert read_block_ms(redis.Redis(socket_timeout=None)) == 5000
    assert read_block_ms(redis.Redis.from_url("redis://127.0.0.1:1/0")) < 5000  # the connection's default
    assert read_block_ms(redis.Redis.from_url("redis://127.0.0.1:1/0?socket_timeout=1")) < 1000


def test_a_quiet_stream_ends_in_our_timeout_not_the_sockets(redis_server):
    """XREAD BLOCK 5000 on a client with a 0.5 s socket timeout raised redis' TimeoutError mid-read."""
    client = redis.Redis.from_url(redis_server.url, socket_timeout=0.5)
    client.flushall()
    write(client, 1, token(0))
    seen = []
    with pytest.raises(TimeoutError, match="no terminal event") as info:
        for event in events(client, "j", timeout_s=1.2):
            seen.append(event)
    assert not isinstance(info.value, redis.TimeoutError)
    assert seen == [token(0)]


def test_follows_on_after_a_redis_restart_from_the_last_id():
    if local_redis.redis_server_path() is None:
        pytest.skip("redis-server is not installed")
    server = local_redis.start()
    servers = [server]
    client = redis.Redis.from_url(server.url)
    write(client, 1, token(0))
    write(client, 2, token(1))
    stream = events(client, "j", timeout_s=30)
    try:
        assert [next(stream), next(stream)] == [token(0), token(1)]

        def restart() -> None:
            # No persistence: the stream comes back empty, and the worker writes on from where it was.
            servers[0].stop()
            servers[0] = local_redis.start(port=server.port)
            fresh = redis.Redis.from_url(server.url)
            write(fresh, 3, token(2))
            write(fresh, 4, {"type": "done", "finish_reason": "length"})

        restarter = threading.Thread(target=restart)
        restarter.start()
        rest = list(stream)
        restarter.join(timeout=30)
    finally:
        servers[0].stop()
    assert rest == [token(2), {"type": "done", "finish_reason": "length"}]

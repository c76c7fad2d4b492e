"""The gateway's client packs commands with hiredis (redis.asyncio packs in Python), writing exactly what
redis-py's own packer writes, for every URL scheme."""

from __future__ import annotations

import asyncio
import warnings

import pytest
from redis.asyncio.connection import Connection, SSLConnection, UnixDomainSocketConnection
from redis.exceptions import DataError
from redis.utils import HIREDIS_AVAILABLE

from worker.gateway.redis_client import connect_async
from worker.gateway.settings import GatewaySettings
from worker.wire.async_packing import HiredisPacking

pytestmark = pytest.mark.skipif(not HIREDIS_AVAILABLE, reason="needs hiredis >= 3.2 (redis-py's own test)")

COMMANDS = [
    ("XREAD", "COUNT", 1000, "BLOCK", 100, "STREAMS", b"a:out:1", "a:out:\u00e9", b"0", b"1-2"),
    ("CLIENT SETINFO", "LIB-NAME", "redis-py"),  # a name of two words is two arguments
    (b"CONFIG GET", b"maxmemory"),
    ("ZADD", "z", 0.1, "m", 1e300, "n", -3, "o"),  # floats as repr writes them
    ("SET", memoryview(b"k"), bytearray(b"v")),
]


@pytest.mark.parametrize("args", COMMANDS, ids=lambda args: str(args[0]))
def test_hiredis_packs_what_redis_pys_packer_packs(args):
    packed = connect_async(
        GatewaySettings(redis_url="redis://127.0.0.1:1/0")
    ).connection_pool.make_connection()
    assert isinstance(packed, HiredisPacking)
    assert b"".join(packed.pack_command(*args)) == b"".join(Connection().pack_command(*args))


def test_what_redis_py_refuses_is_still_refused():
    packed = connect_async(
        GatewaySettings(redis_url="redis://127.0.0.1:1/0")
    ).connection_pool.make_connection()
    for wrong in (True, None, object()):
        with pytest.raises(DataError):
            packed.pack_command("SET", "k", wrong)


def test_the_client_is_made_without_a_warning():
    # redis-py 8 warns (UserWarning), on every `conveyor serve` start, when given a synchronous Retry.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        connect_async(GatewaySettings(redis_url="redis://127.0.0.1:1/0"))


@pytest.mark.parametrize(
    "url, base",
    [
        ("redis://127.0.0.1:1/0", Connection),
        ("rediss://127.0.0.1:1/0", SSLConnection),
        ("unix:///tmp/none.sock", UnixDomainSocketConnection),
    ],
)
def test_each_scheme_keeps_its_connection_class(url, base):
    pool = connect_async(GatewaySettings(redis_url=url)).connection_pool
    assert issubclass(pool.connection_class, HiredisPacking) and issubclass(pool.connection_class, base)


@pytest.mark.redis
def test_commands_and_pipelines_round_trip(redis_server):
    async def body() -> None:
        client = connect_async(GatewaySettings(redis_url=redis_server.url))
        try:
            await client.set("packed:k", "v\u00e9")
            pipe = client.pipeline(transaction=False)
            pipe.xadd("packed:s", {b"event": b"{}"})
            pipe.get("packed:k")
            _, value = await pipe.execute()
            assert value == "v\u00e9".encode()
            assert [key for key, _ in await client.xread({"packed:s": b"0"}, count=10)] == [b"packed:s"]
        finally:
            await client.aclose()

    asyncio.run(body())

"""The gateway's `redis.asyncio` client, made as worker.connection.connect makes the worker's (bytes, RESP2,
TLS options for rediss://), with redis-py's retries off: a request's own deadline decides how long to try.

Replies are parsed by hiredis's C reader: redis-py picks it by itself when hiredis >= 3.2 is installed
(redis.utils.HIREDIS_AVAILABLE). Commands are not: redis.asyncio packs them in Python (its sync client
has a hiredis packer, the asyncio one has no such option), which for the hub's XREAD of every live
stream, once per engine step, is tens of µs. So the connections here pack with hiredis."""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.utils import HIREDIS_AVAILABLE

from worker.connection import TlsOptions
from worker.gateway.settings import GatewaySettings

if HIREDIS_AVAILABLE:
    from hiredis import pack_command


class HiredisPacking:
    """Mixed into a redis.asyncio connection class: one command packed by hiredis.pack_command. The
    arguments are still encoded by redis-py's encoder first, so what goes out is byte for byte what
    redis-py's packer writes (floats as repr, bool refused, str in the client's encoding)."""

    encoder: Any

    def pack_command(self, *args: Any) -> list[bytes]:
        name, encode = args[0], self.encoder.encode
        # A name with words in it ("CLIENT SETINFO") is several arguments to Redis.
        words = name.encode().split() if isinstance(name, str) else name.split()
        # hiredis takes bytes, not a memoryview or bytearray (which the encoder passes through as they are)
        return [pack_command((*words, *[a if type(a) is bytes else bytes(encode(a)) for a in args[1:]]))]


_PACKING: dict[type, type] = {}


def _packing(base: type) -> type:
    """`base` (the class the pool chose for the URL: TCP, TLS or a Unix socket) packing with hiredis."""
    if base not in _PACKING:
        _PACKING[base] = type(f"Hiredis{base.__name__}", (HiredisPacking, base), {})
    return _PACKING[base]


def _driver_info() -> dict:
    """What redis-py names itself to Redis with (CLIENT SETINFO), made once: by default each new connection
    looks its version up in the package metadata, on the event loop, a burst of lookups when many
    requests arrive at once. redis-py 8 takes it as `driver_info`; older versions have no such type."""
    try:
        from redis.driver_info import DriverInfo
    except ImportError:
        return {}
    return {"driver_info": DriverInfo()}


def connect_async(settings: GatewaySettings):
    tls = TlsOptions(
        settings.redis_ca_certs, settings.redis_certfile, settings.redis_keyfile, settings.redis_cert_reqs
    )
    extra = tls.kwargs() if settings.redis_url.startswith("rediss://") else {}
    common = dict(
        decode_responses=False,
        **_driver_info(),
        socket_timeout=settings.redis_socket_timeout,
        socket_connect_timeout=min(5.0, settings.redis_socket_timeout),
        **extra,
    )
    if settings.cluster:  # its nodes make their own connections; cluster mode has no hub XREAD to pack
        return aioredis.RedisCluster.from_url(settings.redis_url, **common)
    client = aioredis.Redis.from_url(
        settings.redis_url, protocol=2, health_check_interval=15, retry=Retry(NoBackoff(), 0), **common
    )
    if HIREDIS_AVAILABLE:  # a connection_class given to from_url loses to the one the URL's scheme names
        pool = client.connection_pool
        pool.connection_class = _packing(pool.connection_class)
    return client

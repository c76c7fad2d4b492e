"""The gateway's `redis.asyncio` client, made as worker.connection.connect makes the worker's (bytes, RESP2,
TLS options for rediss://), with redis-py's retries off: a request's own deadline decides how long to try.

Its connections pack commands with hiredis (worker/wire/async_packing.py)."""

from __future__ import annotations

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry  # not redis.retry's: redis-py 8 warns at each start, converting it
from redis.backoff import NoBackoff

from worker.connection import TlsOptions
from worker.gateway.settings import GatewaySettings
from worker.wire.async_packing import pack_with_hiredis


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
    pack_with_hiredis(client)
    return client

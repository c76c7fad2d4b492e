"""redis.asyncio connections that pack commands with hiredis (the gateway's client, worker/gateway/).

redis-py parses replies with hiredis's C reader by itself when hiredis >= 3.2 is installed
(redis.utils.HIREDIS_AVAILABLE), but redis.asyncio packs commands in Python (its sync client has a hiredis
packer, the asyncio one has no such option): for the gateway hub's XREAD of every live stream, once per
engine step, tens of µs. A `connection_class` given to `from_url` loses to the one the URL's scheme names
(TCP, TLS, a Unix socket), so the pool's class is swapped after the client is made.
"""

from __future__ import annotations

from typing import Any

from redis.utils import HIREDIS_AVAILABLE

from worker.wire.exchange import wire_command

if HIREDIS_AVAILABLE:
    from hiredis import pack_command


class HiredisPacking:
    """Mixed into a redis.asyncio connection class: one command packed by hiredis.pack_command. The
    arguments are still encoded by redis-py's encoder first, so what goes out is byte for byte what
    redis-py's packer writes (floats as repr, bool refused, str in the client's encoding)."""

    encoder: Any

    def pack_command(self, *args: Any) -> list[bytes]:
        encode = self.encoder.encode
        # hiredis takes bytes, not a memoryview or bytearray (which the encoder passes through as they are)
        encoded = [a if type(a) is bytes else bytes(encode(a)) for a in args[1:]]
        return [pack_command(wire_command((args[0], *encoded)))]


_PACKING: dict[type, type] = {}


def hiredis_packing(base: type) -> type:
    """`base` (the class the pool chose for the URL) packing with hiredis."""
    if base not in _PACKING:
        _PACKING[base] = type(f"Hiredis{base.__name__}", (HiredisPacking, base), {})
    return _PACKING[base]


def pack_with_hiredis(client) -> None:
    """Make `client`'s (a redis.asyncio.Redis) new connections pack with hiredis, when it is installed."""
    if HIREDIS_AVAILABLE:
        pool = client.connection_pool
        pool.connection_class = hiredis_packing(pool.connection_class)

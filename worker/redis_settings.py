"""How a command reaches Redis: the URL, the socket timeout and the TLS files. Each field is an option of
every command that talks to Redis (worker/cli/main.py `redis_connection_options`), and the gateway's
settings take their defaults from here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from engine.config import knob


@dataclass(frozen=True)
class RedisSettings:
    redis_url: str = knob("redis://localhost:6379/0", "redis://, rediss:// (TLS); user:password@ for ACL")
    redis_socket_timeout: float = knob(
        30.0,
        "seconds a Redis reply may take before the connection counts as lost (a frozen network)",
        min=0.1,
    )
    redis_ca_certs: str | None = knob(None, "TLS: CA bundle")
    redis_certfile: str | None = knob(None, "TLS: client certificate")
    redis_keyfile: str | None = knob(None, "TLS: client key")
    redis_cert_reqs: Literal["required", "optional", "none"] | None = knob(
        None, "TLS: whether the server's certificate is checked (default: required)"
    )

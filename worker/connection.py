"""Connecting to Redis (AUTH, ACL users and TLS come from the URL) and retrying with capped backoff."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

import redis
import structlog
from redis.backoff import NoBackoff
from redis.retry import Retry

from worker.recover.redis_health import RedisHealth

log = structlog.get_logger("conveyor.redis")
T = TypeVar("T")

# What "Redis is unreachable right now" looks like; anything else is a real error.
DOWN_ERRORS = (redis.ConnectionError, redis.TimeoutError, ConnectionError, OSError)


@dataclass(frozen=True)
class TlsOptions:
    """Passed through to redis-py for rediss:// URLs (None: redis-py's defaults)."""

    ca_certs: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    cert_reqs: str | None = None  # "required" | "optional" | "none"

    def kwargs(self) -> dict:
        pairs = {
            "ssl_ca_certs": self.ca_certs,
            "ssl_certfile": self.certfile,
            "ssl_keyfile": self.keyfile,
            "ssl_cert_reqs": self.cert_reqs,
        }
        return {k: v for k, v in pairs.items() if v is not None}


SOCKET_TIMEOUT_S = 30.0  # a read waits this long for a reply before the connection counts as lost


def connect(url: str, tls: TlsOptions | None = None, socket_timeout: float = SOCKET_TIMEOUT_S) -> redis.Redis:
    """A client that returns bytes (payloads may be any binary) and speaks RESP2 (fixed reply shapes).
    redis-py's own retries are off: each caller retries itself (`with_retry`, client.events), and a retry
    inside redis-py, reconnecting to a frozen network, would hold a stop for one more socket timeout."""
    extra = tls.kwargs() if tls is not None and url.startswith("rediss://") else {}
    return redis.Redis.from_url(
        url,
        decode_responses=False,
        protocol=2,
        socket_timeout=socket_timeout,
        socket_connect_timeout=min(5.0, socket_timeout),
        health_check_interval=15,
        retry=Retry(NoBackoff(), 0),
        **extra,
    )


class Backoff:
    """Capped exponential backoff; `reset()` after a success so the next outage starts small."""

    def __init__(self, first_s: float = 0.05, cap_s: float = 5.0) -> None:
        self.first_s, self.cap_s, self.failures = first_s, cap_s, 0

    def next_delay(self) -> float:
        self.failures += 1
        return min(self.cap_s, self.first_s * 2 ** (self.failures - 1))

    def reset(self) -> None:
        self.failures = 0


class StopRequested(Exception):
    """Raised out of a retry loop when the stop's time is up: the worker ends without finishing the action."""


class Waiter(Protocol):
    """What a retry loop asks of whoever may stop it (worker.run.stop.StopFlag)."""

    def expired(self) -> bool: ...

    def sleep(self, seconds: float) -> None: ...


class _NeverStop:
    def expired(self) -> bool:
        return False

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


def with_retry(
    action: Callable[[], T],
    what: str,
    stop: Waiter | None = None,
    backoff: Backoff | None = None,
    health: RedisHealth | None = None,
) -> T:
    """Run `action` until Redis answers. Unreachable (DOWN_ERRORS) and full (OOM under noeviction) are
    waited out with back-off; a refused password is not. Gives up only when `stop` has expired, raising
    StopRequested with the last Redis error as its cause. (Whether Redis has room again is for the caller
    to say: an EXEC that went through may still hold commands refused for lack of memory.)"""
    stop = stop or _NeverStop()
    backoff = backoff or Backoff()
    health = health or RedisHealth()
    while True:
        if stop.expired():  # a new try could hang on a frozen network past the stop's bound
            raise StopRequested(f"stopped before {what}")
        try:
            result = action()
        except (*DOWN_ERRORS, redis.OutOfMemoryError) as exc:
            # A refused password or ACL user will not get better by waiting: fail with the reason.
            if isinstance(exc, redis.AuthenticationError):
                raise
            if stop.expired():
                raise StopRequested(f"stopped while {what}: {exc}") from exc
            delay = backoff.next_delay()
            if isinstance(exc, redis.OutOfMemoryError):
                health.full(what, exc, delay)
            else:
                log.warning("redis unavailable, retrying", during=what, error=str(exc), retry_in_s=delay)
            stop.sleep(delay)
            continue
        if backoff.failures:
            log.info("redis reachable again", during=what, after_failures=backoff.failures)
            backoff.reset()
        return result

"""Checks before a worker loads its model: a Redis URL that can work, a server that answers, a user that
may run every command the worker sends (worker/acl.py), and a memory policy that will not evict the
worker's keys.

Any `maxmemory-policy` but `noeviction` lets Redis delete keys when it is full: `allkeys-*` the requests
stream itself (jobs vanish without an event), `volatile-*` every key with a TTL, which includes every
output stream (clients lose events mid-job; the next write recreates the stream with a gap). So the
worker refuses such a server unless told `--allow-eviction`. A server that hides CONFIG (managed Redis
often renames it) is let through with a warning: the operator has to check the policy.
"""

from __future__ import annotations

import time
from typing import Any

import redis
import structlog

from worker.acl import OPTIONAL_COMMANDS, missing_commands
from worker.config import WorkerConfig
from worker.connection import DOWN_ERRORS, Backoff
from worker.intake.lane_layout import LaneLayout, read_layout
from worker.keys import Keys


def _log():
    # A fresh logger per call: these run once, before (and while) logging is configured for the run.
    return structlog.get_logger("conveyor.worker")


START_TRIES = 8  # about 6 s of capped back-off (0.05 s doubling) before a worker gives up at start


class PreflightError(RuntimeError):
    """The worker must not start; the message says why and what to do."""


def check_url(url: str) -> str:
    """The URL as redis-py will read it, or ValueError with redis-py's reason (scheme, port...)."""
    redis.connection.parse_url(url)
    return url


def wait_reachable(client: redis.Redis, url: str, tries: int = START_TRIES) -> None:
    """PING until it answers, at most `tries` times: a wrong host or port fails the start, not the first job."""
    backoff = Backoff()
    for attempt in range(1, tries + 1):
        try:
            client.ping()
            return
        except redis.AuthenticationError:
            raise
        except DOWN_ERRORS as exc:
            if attempt == tries:
                raise PreflightError(
                    f"cannot reach Redis at {safe_url(url)} after {tries} tries: {exc}"
                ) from exc
            delay = backoff.next_delay()
            _log().warning("redis not reachable yet", error=str(exc), attempt=attempt, retry_in_s=delay)
            time.sleep(delay)


def check_permissions(client: redis.Redis, cfg: WorkerConfig) -> None:
    """PreflightError naming every command the URL's user may not run on the worker's keys and channels."""
    missing = [c for c in missing_commands(client, cfg) if c not in OPTIONAL_COMMANDS]
    if missing:
        raise PreflightError(
            f"the Redis user in --redis-url may not run {' '.join(missing)} on {cfg.keys.prefix}:* keys "
            "and channels: grant them (docs/operations.md, Security)"
        )


def check_eviction_policy(client: redis.Redis, allow_eviction: bool) -> str | None:
    """The server's maxmemory-policy (None when CONFIG is unavailable). Raises PreflightError on an
    evicting policy unless allow_eviction, in which case it logs a loud warning and goes on."""
    try:
        # Any: redis-py types replies for both decode modes; the key is bytes or str accordingly.
        reply: Any = client.config_get("maxmemory-policy")
    except redis.ResponseError as exc:  # CONFIG disabled, renamed, or denied by ACL
        _log().warning(
            "cannot read maxmemory-policy (CONFIG unavailable): make sure it is noeviction, or Redis may "
            "drop queued jobs and output streams when full",
            error=str(exc),
        )
        return None
    policy = _text(reply.get(b"maxmemory-policy", reply.get("maxmemory-policy")))
    if policy is None or policy == "noeviction":
        return policy
    if not allow_eviction:
        raise PreflightError(
            f"Redis maxmemory-policy is {policy!r}: when full, Redis may evict the requests stream or output "
            "streams (jobs lost without an event, streams with gaps). Set maxmemory-policy noeviction, or "
            "pass --allow-eviction (CONVEYOR_ALLOW_EVICTION=1) to run anyway."
        )
    _log().warning(
        "REDIS MAY EVICT WORKER KEYS: running with --allow-eviction on an evicting maxmemory-policy; "
        "jobs and events can be lost when Redis is full",
        policy=policy,
    )
    return policy


def _text(value) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def safe_url(url: str) -> str:
    """The URL without its password, for messages."""
    parsed = redis.connection.urlparse(url)
    if parsed.password:
        return url.replace(f":{parsed.password}@", ":***@")
    return url


def check_lane_layout(client: redis.Redis, keys: Keys, layout: LaneLayout | None) -> None:
    """Warn when the lane layout in Redis (intake/lane_layout.py) is not this worker's: clients then add
    jobs to streams it does not read (a worker without lanes after lane workers), or other workers of
    the stream read other lanes (they were started with other options)."""
    try:
        found = read_layout(client, keys)
    except ValueError as exc:
        _log().warning(
            "the lane layout in Redis is not valid JSON of a layout", key=keys.lane_layout, error=str(exc)
        )
        return
    if found is None or found == layout:
        return
    if layout is None:
        _log().warning(
            "clients add jobs to lane streams this worker does not read: start it with the same "
            "--priority-lanes or --tenant-weight as the workers that wrote the layout, or DEL the key "
            "once those lanes are empty (docs/operations.md, Priority lanes and tenant fair share)",
            key=keys.lane_layout,
            streams=found.streams,
        )
    else:
        _log().warning(
            "replacing another lane layout: give every worker of this stream the same lane options",
            key=keys.lane_layout,
            was=found.streams,
            now=layout.streams,
        )

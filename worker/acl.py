"""The Redis commands a worker sends, directly and from its Lua scripts, in one list: the ACL rule in
docs/operations.md ("Security"), the permission check at start and the ACL tests all read it.

The check queues one probe of each command inside MULTI and never runs them: Redis checks a command's
ACL (command, keys, channels) when it is queued, and a queued command with a wrong argument count
makes the EXEC that ends the probe abort, so nothing is written. Any user who may run MULTI and EXEC can
be checked this way (ACL DRYRUN would need an admin permission the worker has no use for). Redis checks
the commands a Lua script calls against the same user, so probing them directly covers the scripts too.
"""

from __future__ import annotations

import redis

from worker.config import WorkerConfig

# Lower-case, `command|subcommand` as ACL SETUSER writes them. Sources (under worker/): wire/
# (MULTI/EXEC), intake/stream_reader.py, job_path.py (lookups incl. HMGET attempts, attempt counts incl.
# HSET of the alone field, refusals), run/aborts.py, run/job_lease.py, recover/takeover_claim.py,
# run/cancel_listener.py, run/consumer_lease.py, wire/lua_script.py, cli/preflight.py, the observer's
# XINFO GROUPS, fleet/heartbeat.py (the registry record and index), fleet/home_watch.py (reads the
# registry, and its peers' shards' XINFO GROUPS), and the scripts in
# publish/publisher.py, intake/stream_trim.py and run/consumer_lease.py.
WORKER_COMMANDS: tuple[str, ...] = (
    "ping",
    "multi",
    "exec",
    "xreadgroup",
    "xack",
    "xadd",
    "xclaim",
    "xautoclaim",
    "xrange",
    "xpending",
    "xtrim",
    "xgroup|create",
    "xinfo|groups",
    "set",
    "get",
    "mget",
    "del",
    "exists",
    "expire",
    "hmget",
    "hset",
    "hincrby",
    "hdel",
    "zadd",
    "zrange",
    "zrem",
    "zremrangebyscore",
    "publish",
    "subscribe",
    "unsubscribe",
    "eval",
    "evalsha",
    "script|load",
    "config|get",
)
# Without these the worker still runs: preflight.py only warns that it cannot read the eviction policy.
OPTIONAL_COMMANDS = ("config|get",)


def acl_rule(user: str = "conveyor", password: str = "secret", prefix: str = "conveyor") -> str:
    """The ACL SETUSER line that grants a worker exactly WORKER_COMMANDS on its own keys and channels."""
    granted = " ".join(f"+{c}" for c in WORKER_COMMANDS)
    return (
        f"ACL SETUSER {user} on >{password} resetkeys ~{prefix}:* resetchannels &{prefix}:* -@all {granted}"
    )


def _probes(cfg: WorkerConfig) -> dict[str, tuple]:
    """One well-formed call of each command but MULTI and EXEC, on the keys and channels it really uses."""
    k, g, c = cfg.keys, cfg.group, cfg.consumer
    stream, job = k.requests, "acl-probe"
    sha = "0" * 40
    return {
        "ping": ("PING",),
        "xreadgroup": ("XREADGROUP", "GROUP", g, c, "COUNT", 1, "STREAMS", stream, ">"),
        "xack": ("XACK", stream, g, "0-1"),
        "xadd": ("XADD", k.out(job), "0-1", "event", "x"),
        "xclaim": ("XCLAIM", stream, g, c, 0, "0-1", "JUSTID"),
        "xautoclaim": ("XAUTOCLAIM", stream, g, c, 0, "0-0", "COUNT", 1),
        "xrange": ("XRANGE", k.out(job), "-", "+"),
        "xpending": ("XPENDING", stream, g),
        "xtrim": ("XTRIM", stream, "MINID", "0-0"),
        "xgroup|create": ("XGROUP", "CREATE", stream, g, "0", "MKSTREAM"),
        "xinfo|groups": ("XINFO", "GROUPS", stream),
        "set": ("SET", k.owner(job), c, "NX", "GET", "PX", 1),
        "get": ("GET", k.owner(job)),
        "mget": ("MGET", k.cancel(job)),
        "del": ("DEL", k.owner(job)),
        "exists": ("EXISTS", k.cancel(job)),
        "expire": ("EXPIRE", k.out(job), 1),
        "hmget": ("HMGET", k.attempts, job),
        "hset": ("HSET", k.attempts, f"{job}/alone", 1),
        "hincrby": ("HINCRBY", k.attempts, job, 1),
        "hdel": ("HDEL", k.attempts, job),
        "zadd": ("ZADD", k.workers, 0, c),
        "zrange": ("ZRANGE", k.workers, 0, -1),
        "zrem": ("ZREM", k.workers, c),
        "zremrangebyscore": ("ZREMRANGEBYSCORE", k.workers, "-inf", 0),
        "publish": ("PUBLISH", k.cancel_channel, job),
        "subscribe": ("SUBSCRIBE", k.cancel_channel),
        "unsubscribe": ("UNSUBSCRIBE", k.cancel_channel),
        "eval": ("EVAL", "return 0", 1, k.owner(job)),
        "evalsha": ("EVALSHA", sha, 1, stream),
        "script|load": ("SCRIPT", "LOAD", "return 0"),
        "config|get": ("CONFIG", "GET", "maxmemory-policy"),
    }


def missing_commands(client: redis.Redis, cfg: WorkerConfig) -> list[str]:
    """The WORKER_COMMANDS this client's user may not run on the worker's keys and channels (empty: all
    allowed). Runs nothing but an empty transaction."""
    first = _replies(client, [("MULTI",), ("EXEC",)])
    if _refused(first[0]):
        return ["multi"]  # without MULTI the probes would run for real: the rest is checked once it may
    missing = ["exec"] if _refused(first[1]) else []
    probes = _probes(cfg)
    # GET with no key: refused at queue time, so the EXEC below aborts whatever else was queued (a
    # refused EXEC discards the transaction too).
    replies = _replies(client, [("MULTI",), *probes.values(), ("GET",), ("EXEC",)])
    missing += [name for name, reply in zip(probes, replies[1:], strict=False) if _refused(reply)]
    return sorted(missing, key=WORKER_COMMANDS.index)


def _replies(client: redis.Redis, commands: list[tuple]) -> list:
    # One connection, in order, with no reply parsing: the replies are +OK, +QUEUED or errors.
    pipe = client.pipeline(transaction=False)
    pipe.response_callbacks = type(pipe.response_callbacks)({})  # a new, empty one: no parsers
    for args in commands:
        pipe.execute_command(*args)
    return pipe.execute(raise_on_error=False)


def _refused(reply) -> bool:
    # A refused EXEC answers EXECABORT quoting the NOPERM error.
    if isinstance(reply, redis.exceptions.ExecAbortError):
        return "NOPERM" in str(reply)
    return isinstance(reply, redis.exceptions.NoPermissionError)

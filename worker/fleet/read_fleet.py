"""Read Redis into a FleetSnapshot (worker/fleet/snapshot.py), with a synchronous client: one Redis or a
Redis Cluster (every command touches one key, so redis-py routes each to its node).

Which streams: `<prefix>:requests`, each live worker's `streams` (per-model streams, lanes, a cluster's
shards) and any named by the caller. Besides, every request stream found by SCAN (`<prefix>:requests*`,
a shard's `<prefix>:{s<k>}:requests*`) that holds unread jobs is listed with the live workers that read
it, so jobs in a stream nobody reads (a client that named no model, or the wrong one) are seen. Every consumer group on them is a model. Dead letters and usage
counters are read under each key prefix those streams belong to (the prefix, and `<prefix>:{s<k>}` for
a shard's streams).
"""

from __future__ import annotations

import redis

from worker.cluster.shard_keys import ShardedKeys, shard_prefix
from worker.fleet import accounting, registry
from worker.fleet.batch_board import STALE_MS
from worker.fleet.snapshot import (
    HOUR_MS,
    BatchView,
    FleetSnapshot,
    ModelView,
    StreamView,
    WorkerView,
    drain_seconds,
    quantile,
)
from worker.keys import Keys

LAG_COUNT_MAX = 100_000  # entries counted by XRANGE when Redis cannot give a group's lag
DEAD_COUNT_MAX = 100_000  # dead letters of the last hour counted, at most


def take(client, prefix: str = "conveyor", streams: tuple[str, ...] = ()) -> FleetSnapshot:
    keys = Keys(prefix=prefix)
    seconds, micros = client.time()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    members = registry.read(client, keys)
    records = registry.live(members)
    names = list(dict.fromkeys([keys.requests, *(s for r in records for s in r.streams), *streams]))
    prefixes = _prefixes(prefix, names)

    models: dict[str, ModelView] = {}
    for stream in names:
        for group in _groups(client, stream):
            name = _text(group["name"])
            view = models.setdefault(name, ModelView(model=name, group=name, streams=[]))
            view.streams.append(stream)
            view.backlog += _lag(client, stream, group)
            view.pending += int(group.get("pending") or 0)
            oldest = _oldest_undelivered_ms(client, stream, group)
            if oldest is not None:
                wait = max(0.0, (now_ms - oldest) / 1000)
                view.oldest_wait_s = max(view.oldest_wait_s or 0.0, wait)
    for record in records:
        view = models.setdefault(record.group, ModelView(model=record.model, group=record.group, streams=[]))
        view.model = record.model
        view.workers += 1
        view.jobs_per_s += record.jobs_per_s
        view.tokens_in_per_s += record.tokens_in_per_s
        view.tokens_out_per_s += record.tokens_out_per_s

    tenants = accounting.parse(client.hgetall(Keys(prefix=p).usage) for p in prefixes)
    for view in models.values():
        used = [u for u in tenants if u.model == view.group]
        jobs = sum(u.jobs for u in used)
        if jobs:
            view.tokens_per_job = sum(u.prompt_tokens + u.completion_tokens for u in used) / jobs
            view.backlog_tokens = round(view.backlog * view.tokens_per_job)
        view.drain_s = drain_seconds(view)
    for u in tenants:  # usage is kept per group: show it under the model's name
        if u.model in models:
            u.model = models[u.model].model

    dead_total = 0
    for p in prefixes:
        for _, fields in client.xrange(Keys(prefix=p).dead, min=now_ms - HOUR_MS, count=DEAD_COUNT_MAX):
            dead_total += 1
            dead_group = _text(fields.get(b"group", b""))
            if dead_group in models:
                models[dead_group].dead_last_hour += 1

    ttfts = [t for r in records for t in r.ttft_ms_recent]
    p50, p99 = quantile(ttfts, 0.5), quantile(ttfts, 0.99)
    return FleetSnapshot(
        taken_ms=now_ms,
        models=sorted(models.values(), key=lambda m: m.model),
        workers=[_worker(m, now_ms) for m in members],
        tenants=tenants,
        batches=_batches(client, prefixes, now_ms),
        streams=_backlogged(client, prefix, names, records),
        dead_last_hour=dead_total,
        ttft_p50_s=None if p50 is None else p50 / 1000,
        ttft_p99_s=None if p99 is None else p99 / 1000,
    )


def _backlogged(client, prefix: str, known: list[str], records: list) -> list[StreamView]:
    """Every request stream with entries no group has read (all of them, when it has no group)."""
    found = set(known)
    for pattern in (f"{prefix}:requests*", f"{prefix}:{{s*}}:requests*"):
        found.update(_text(k) for k in client.scan_iter(match=pattern, count=1000, _type="stream"))
    views = []
    for stream in sorted(found):
        groups = _groups(client, stream)
        backlog = max((_lag(client, stream, g) for g in groups), default=None)
        if backlog is None:
            backlog = int(client.xlen(stream))
        if backlog:
            readers = sum(stream in r.streams for r in records if not r.draining)
            views.append(StreamView(stream=stream, backlog=backlog, readers=readers))
    return views


def _prefixes(prefix: str, streams: list[str]) -> list[str]:
    """The prefix, and the shard prefix of each stream of the sharded layout."""
    found = [prefix]
    layout = ShardedKeys(prefix, shards=1 << 16)  # any shard number parses
    for stream in streams:
        try:
            shard = layout.shard_of(stream)
        except ValueError:
            continue
        found.append(shard_prefix(prefix, shard))
    return list(dict.fromkeys(found))


def _groups(client, stream: str) -> list[dict]:
    try:
        return client.xinfo_groups(stream)
    except redis.ResponseError:  # no such stream (yet)
        return []


def _lag(client, stream: str, group: dict) -> int:
    lag = group.get("lag")
    if lag is not None:
        return int(lag)
    # Redis cannot tell (entries were deleted in the undelivered range): count them.
    start = "(" + _text(group["last-delivered-id"])
    return len(client.xrange(stream, min=start, count=LAG_COUNT_MAX))


def _oldest_undelivered_ms(client, stream: str, group: dict) -> int | None:
    start = "(" + _text(group["last-delivered-id"])
    first = client.xrange(stream, min=start, count=1)
    if not first:
        return None
    return int(_text(first[0][0]).split("-")[0])


def _worker(member: registry.Member, now_ms: int) -> WorkerView:
    r = member.record
    age = max(0.0, (now_ms - member.last_heartbeat_ms) / 1000)
    if r is None:
        return WorkerView(consumer=member.consumer, model=None, lost=True, heartbeat_age_s=age)
    return WorkerView(
        consumer=r.consumer,
        model=r.model,
        host=r.host,
        lost=False,
        draining=r.draining,
        running=r.running,
        waiting=r.waiting,
        kv_blocks_used=r.kv_blocks_used,
        kv_blocks_total=r.kv_blocks_total,
        tokens_per_s=r.tokens_out_per_s,
        heartbeat_age_s=age,
    )


def _batches(client, prefixes: list[str], now_ms: int) -> list[BatchView]:
    """Batches in progress: `<prefix>:batches`, a hash of batch id -> BatchView JSON kept by the batch
    driver (worker/fleet/batch_board.py); fields not updated for STALE_MS are a dead driver's."""
    out = []
    for p in prefixes:
        for raw in client.hvals(Keys(prefix=p).batches):
            try:
                view = BatchView.model_validate_json(raw)
            except ValueError:
                continue
            if now_ms - view.updated_ms <= STALE_MS:
                out.append(view)
    return sorted(out, key=lambda b: b.id)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value

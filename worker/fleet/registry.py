"""The worker registry: one short-lived record per live worker, readable from any Redis client.

Two kinds of key under the deployment's prefix (docs/protocol.md, "Worker registry"):

    <prefix>:worker:<consumer>   string, the record as JSON (WorkerRecord), SET with PX ttl_ms at each
                                 heartbeat: it exists exactly while the worker is alive (or dead for less
                                 than one TTL, the time a `kill -9` takes to show)
    <prefix>:workers             sorted set, member <consumer>, score = its last heartbeat (ms since the
                                 epoch, the worker's clock): the index, so readers need no SCAN. A member
                                 whose record key is gone is a worker that stopped beating: `lost`, until
                                 writers prune members older than FORGET_MS. A worker that stops cleanly
                                 removes both.

Liveness is the record key's TTL, kept by Redis, so readers on other hosts need no clock agreement. The
heartbeat and TTL are in the record, so a reader knows how stale a record may be. In Redis Cluster the two
keys live in different slots: each command touches one key, and nothing needs them in one transaction.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict

from worker.keys import Keys

FORGET_MS = 3_600_000  # index members without a record for this long are pruned (no longer shown as lost)
RECORD_VERSION = 1
TTFT_KEPT = 64  # TTFTs a record carries


class WorkerRecord(BaseModel):
    """What a worker says about itself at each heartbeat. Readers ignore fields they do not know, so a
    newer worker can add fields without breaking older readers (extra="allow" keeps them)."""

    model_config = ConfigDict(extra="allow", protected_namespaces=())

    v: int = RECORD_VERSION
    consumer: str  # the worker's consumer name: unique among live workers
    model: str  # the served model name clients ask for
    group: str  # the consumer group it reads its streams through
    streams: list[str]  # the request streams (lanes) it reads
    host: str
    pid: int
    version: str  # Conveyor's package version
    max_model_len: int
    capacity: int  # sequences it runs at once (max_num_seqs)
    started_ms: int
    heartbeat_ms: int  # when this record was written (worker's clock)
    ttl_ms: int  # the record key expires this long after heartbeat_ms unless renewed
    running: int = 0
    waiting: int = 0
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    # New jobs its engine could start now (worker/run/engine_room.py: free slots, KV blocks at its jobs'
    # current use, 0 while one waits); None: a worker from before this field (see `full`).
    room: int | None = None
    tokens_in_per_s: float = 0.0  # prompt tokens computed (prefix-cache hits excluded) per second
    tokens_out_per_s: float = 0.0  # output tokens per second
    last_step_ms: int | None = None  # when its engine last stepped (worker's clock); None: never
    draining: bool = False  # stopping: finishing its jobs, taking no new ones
    prompt_tokens: int = 0  # prompt tokens received since start (engine.stats().num_prompt_tokens)
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache since start
    prefix_cache_hits: int = 0  # of those, found: computed = queries - hits
    home_shards: list[int] | None = None  # the shards it reads first (prefix affinity); None: no home set
    jobs_per_s: float = 0.0  # jobs finished per second
    # Time to first token (enqueue to first token, ms) of its latest jobs, newest last, at most TTFT_KEPT:
    # readers pool the fleet's lists for TTFT quantiles (worker/fleet/snapshot.py).
    ttft_ms_recent: list[int] = []

    @property
    def free(self) -> int:
        """Jobs it could start now, as of this record (peers steal by it: home_watch.py). Records without
        `room` tell only slots, and KV blocks can run out first."""
        if self.room is not None:
            return self.room
        return 0 if self.waiting > 0 else max(0, self.capacity - self.running)

    @property
    def full(self) -> bool:
        """It could start no job now: a job a peer leaves in its shards would wait."""
        return self.free == 0


class Member(BaseModel):
    """One index member as a reader sees it: its record, or None when the record lapsed (lost)."""

    consumer: str
    last_heartbeat_ms: int
    record: WorkerRecord | None

    @property
    def lost(self) -> bool:
        return self.record is None


def members(
    index: Iterable[tuple[bytes | str, float]], records: Iterable[bytes | str | None]
) -> list[Member]:
    """Index entries (consumer, score) and their record values (same order; None where the key is gone)
    as Members. A record that does not parse counts as lost (a worker of an incompatible version)."""
    out = []
    for (name, score), raw in zip(index, records, strict=True):
        consumer = name.decode() if isinstance(name, bytes) else name
        record = None
        if raw is not None:
            try:
                record = WorkerRecord.model_validate_json(raw)
            except ValueError:
                record = None
        out.append(Member(consumer=consumer, last_heartbeat_ms=int(score), record=record))
    return out


def read(client, keys: Keys) -> list[Member]:
    """Every indexed worker, live or lost, with a synchronous client (redis.Redis or RedisCluster)."""
    index = client.zrange(keys.workers, 0, -1, withscores=True)
    if not index:
        return []
    pipe = client.pipeline(transaction=False)  # one key per command: fine across cluster slots too
    for name, _ in index:
        pipe.get(keys.worker(_name(name)))
    return members(index, pipe.execute())


async def read_async(client, keys: Keys) -> list[Member]:
    """The same with a `redis.asyncio` client (the HTTP gateway)."""
    index = await client.zrange(keys.workers, 0, -1, withscores=True)
    if not index:
        return []
    pipe = client.pipeline(transaction=False)
    for name, _ in index:
        pipe.get(keys.worker(_name(name)))
    return members(index, await pipe.execute())


def live(found: list[Member]) -> list[WorkerRecord]:
    return [m.record for m in found if m.record is not None]


def _name(name: bytes | str) -> str:
    return name.decode() if isinstance(name, bytes) else name

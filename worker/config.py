"""The worker's own settings (the engine's are EngineConfig's, LLMEngine's keyword arguments)."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from engine.config import knob
from worker.intake.limits import Limits
from worker.keys import Keys

CLUSTER_SHARDS = 8  # a cluster's shards when --shards is not given


def default_consumer() -> str:
    """Unique per process; pass --consumer to keep a name across restarts (pending entries are resumed)."""
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class WorkerConfig:
    """The worker's settings; each field but group, keys and limits is also a `conveyor worker` option
    (worker/cli/options.py), and Limits' fields are too."""

    group: str
    consumer: str = field(
        default_factory=default_consumer,
        metadata={"help": "consumer name (default: <host>-<pid>); reuse it to resume pending jobs"},
    )
    keys: Keys = field(default_factory=Keys)
    limits: Limits = field(default_factory=Limits)
    lease_ms: int = knob(
        15_000,
        "a job's lease, renewed every lease_ms / 3: jobs idle this long under a silent worker are taken over",
    )
    max_attempts: int = knob(3, "attempts at a job (crashes included) before it is dead-lettered")
    max_wait_ms: int = knob(0, "idle: gather arriving jobs this long before the first step")
    block_ms: int = knob(
        1000, "longest blocking read while idle (the loop wakes to renew leases and look for stop signals)"
    )
    drain_timeout_s: float = knob(30.0, "seconds to finish in-flight jobs after SIGTERM", cli="drain-timeout")
    stream_maxlen: int = knob(
        100_000, "cap on each output stream's length; must exceed any job's event count for resume to work"
    )
    stream_ttl_s: int = knob(3600, "seconds an output stream lives after its last event", cli="stream-ttl")
    dead_maxlen: int = knob(100_000, "cap on the dead-letter stream's length")
    cluster: bool = knob(
        False,
        "Redis Cluster: the queue is --shards streams with protocol version 2's keys (docs/protocol.md), "
        "live events on sharded pub/sub (SPUBLISH)",
    )
    shards: int | None = knob(
        None,
        "the queue's shards, protocol version 2's keys (as many as the clients submit to); unset: one "
        f"stream (version 1) on one Redis, {CLUSTER_SHARDS} shards in cluster mode",
    )
    affinity: bool = knob(
        False,
        "prefix affinity: read this worker's home shards first (rendezvous hashing over the registry's live "
        "workers) and take other shards' jobs only with room to spare; needs --shards or --cluster",
    )
    registry_interval_s: float = knob(
        2.0,
        "seconds between this worker's heartbeats in the fleet registry; its record lapses after 3 missed",
        cli="registry-interval",
    )
    allow_eviction: bool = knob(
        False, "run on a Redis whose maxmemory-policy may evict keys (jobs and events can be lost)"
    )

    def __post_init__(self) -> None:
        if self.lease_ms < 300:
            raise ValueError("lease_ms must be >= 300")
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        if self.shards is not None and self.shards < 1:
            raise ValueError("shards must be >= 1")
        if self.affinity and self.shard_count is None:
            raise ValueError("affinity needs a sharded queue: --shards S (or --cluster)")
        if self.registry_interval_s <= 0:
            raise ValueError("registry_interval_s must be > 0")
        if self.max_wait_ms < 0 or self.block_ms < 1:
            raise ValueError("max_wait_ms must be >= 0 and block_ms >= 1")

    @property
    def shard_count(self) -> int | None:
        """The shards the worker reads (protocol version 2), or None: one stream (version 1)."""
        if self.shards is None and self.cluster:
            return CLUSTER_SHARDS
        return self.shards

    @property
    def heartbeat_s(self) -> float:
        return self.lease_ms / 3000

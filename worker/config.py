"""The worker's own settings (the engine's are LLMEngine's keyword arguments)."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from worker.keys import Keys
from worker.limits import Limits


def default_consumer() -> str:
    """Unique per process; pass --consumer to keep a name across restarts (pending entries are resumed)."""
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class WorkerConfig:
    group: str
    consumer: str = field(default_factory=default_consumer)
    keys: Keys = field(default_factory=Keys)
    limits: Limits = field(default_factory=Limits)
    # A job's lease: renewed every lease_ms / 3; a job idle longer than this is claimed by another worker.
    lease_ms: int = 15_000
    max_attempts: int = 3
    # Idle worker: how long to gather arriving jobs before the first step (0: start at once).
    max_wait_ms: int = 0
    # Longest single blocking read while idle (the loop wakes to renew leases and look for stop signals).
    block_ms: int = 1000
    drain_timeout_s: float = 30.0
    stream_maxlen: int = 100_000  # per output stream; must exceed any job's event count for resume to work
    stream_ttl_s: int = 3600
    dead_maxlen: int = 100_000

    def __post_init__(self) -> None:
        if self.lease_ms < 300:
            raise ValueError("lease_ms must be >= 300")
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        if self.max_wait_ms < 0 or self.block_ms < 1:
            raise ValueError("max_wait_ms must be >= 0 and block_ms >= 1")

    @property
    def heartbeat_s(self) -> float:
        return self.lease_ms / 3000

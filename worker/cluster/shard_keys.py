"""Protocol version 2's key names (docs/protocol.md, "Version 2"): the queue split into N shards.

Shard k's names are version 1's names under the prefix `<prefix>:{s<k>}`. The braces are a Redis Cluster
hash tag: only `s<k>` is hashed, so every key of one shard (its request stream, dead letters, attempts,
and each job's output stream, live channel, owner and cancel key) sits in one hash slot, and the worker's
MULTI/EXEC and its terminal script (event + XACK + owner release) never cross slots. A client computes
every name from k and the job id alone, with no CRC16: it picks the shard it submits to, and reads the
job's output under that same shard's tag.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from worker.keys import Keys

_TAGGED = re.compile(r"^(?P<prefix>.*):\{s(?P<shard>0|[1-9][0-9]*)\}:")


def shard_prefix(prefix: str, shard: int) -> str:
    return f"{prefix}:{{s{shard}}}"


def keys_of_shard_stream(prefix: str, stream: str) -> Keys | None:
    """The keys of the jobs submitted to `stream` when it is a shard's request stream under `prefix`
    (protocol version 2: their output streams carry the same hash tag); None for any other stream."""
    found = _TAGGED.match(stream)
    if found is None or found["prefix"] != prefix:
        return None
    return Keys(prefix=shard_prefix(prefix, int(found["shard"])))


@dataclass(frozen=True)
class ShardedKeys:
    """The names of all `shards` shards under one prefix; `shard(k)` is a v1 `Keys` for shard k."""

    prefix: str = "conveyor"
    shards: int = 8

    def __post_init__(self) -> None:
        if self.shards < 1:
            raise ValueError("shards must be >= 1")
        if "{" in self.prefix or "}" in self.prefix:
            raise ValueError("the prefix may not hold braces: the shard's hash tag must be the first one")

    def shard(self, k: int) -> Keys:
        if not 0 <= k < self.shards:
            raise ValueError(f"shard {k} is not in 0..{self.shards - 1}")
        return Keys(prefix=shard_prefix(self.prefix, k))

    def all(self) -> list[Keys]:
        return [self.shard(k) for k in range(self.shards)]

    def shard_of(self, name: str | bytes) -> int:
        """The shard a v2 key or channel name belongs to (ValueError for a name outside this layout)."""
        text = name.decode() if isinstance(name, bytes) else name
        found = _TAGGED.match(text)
        if found is None or found["prefix"] != self.prefix or int(found["shard"]) >= self.shards:
            raise ValueError(f"{text!r} is not a key of {self}")
        return int(found["shard"])

"""Home shards: which live worker reads each shard of the queue first, by rendezvous hashing.

Every shard k goes to the worker whose weight sha256("<consumer>/<k>") is highest. Each worker computes
the same answer from the same list of live consumer names (the registry, worker/fleet/registry.py), with
no coordination, and the answer moves little: a worker that joins takes exactly the shards where it
outweighs the current owner (its share, about shards / workers), and the shards of a worker that leaves
go each to its own runner-up, so they spread over the others. With more workers than shards some own
none; they only steal (intake/home_first.py).

    shards 6, live {w0, w1}        ->  w0: {1, 2, 4}, w1: {0, 3, 5}
    w2 joins                       ->  w0: {1, 2, 4}, w1: {0, 5}, w2: {3}      (only w2's share moved)
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable


def weight(consumer: str, shard: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{consumer}/{shard}".encode()).digest()[:8], "big")


def home_shards(shards: int, consumers: Iterable[str]) -> dict[str, set[int]]:
    """Per live consumer, the shards (0..shards-1) it owns; every shard has exactly one owner when any
    consumer is live. Ties (equal 64-bit weights) go to the smaller name, so the order given is irrelevant."""
    if shards < 1:
        raise ValueError("shards must be >= 1")
    names = sorted(set(consumers))
    owned: dict[str, set[int]] = {name: set() for name in names}
    if not names:
        return owned
    for shard in range(shards):
        owner = max(names, key=lambda name: weight(name, shard))  # the first maximum: the smaller name
        owned[owner].add(shard)
    return owned

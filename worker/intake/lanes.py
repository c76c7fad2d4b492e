"""Lanes: the request streams a worker reads, each with its consumer group (intake/read_policy.py splits the
room between them).

A lane is where jobs wait: a stream, the group its workers read it through, and the keys its jobs use
(output streams, owner, attempts and cancel keys, dead letters). A layout is a list of lanes:

    single_stream     [conveyor:requests]                            protocol version 1, OneLane
    cluster_shards    [conveyor:{s0}:requests, conveyor:{s1}:...]     protocol version 2, ReadShares
    split_stream      [conveyor:requests:p0, conveyor:requests:p1]   one prefix for the jobs' keys
    LaneLayout.lanes  [conveyor:requests, conveyor:requests:p10]     priority lanes (PriorityLanes) or
                      [conveyor:requests, conveyor:requests:t:a]     tenant lanes (FairShare); the
                                                                     requests stream is the default's
                                                                     lane (intake/lane_layout.py)

A stream per served model is `single_stream` under that model's stream name; home shards with stealing
are `cluster_shards` (or `split_stream`) read with HomeFirst. `cluster_shards` is also the layout of
`--shards` on one Redis. The one loop (run/loop.py) reads every lane of a worker, each with its own keys
and state (run/lane_run.py), over one engine and one write per Redis server each tick
(run/node_rounds.py); run/build.py builds a worker's lanes from its config.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from worker.cluster.shard_keys import ShardedKeys
from worker.keys import Keys


@dataclass(frozen=True)
class Lane:
    keys: Keys  # `keys.requests` is the lane's stream; the rest are its jobs' keys
    group: str

    @property
    def stream(self) -> str:
        return self.keys.requests


def single_stream(keys: Keys, group: str) -> list[Lane]:
    return [Lane(keys, group)]


def cluster_shards(prefix: str, shards: int, group: str) -> list[Lane]:
    """Protocol version 2: each shard's keys in its own hash slot (worker/cluster/shard_keys.py)."""
    return [Lane(keys, group) for keys in ShardedKeys(prefix, shards).all()]


def split_stream(keys: Keys, group: str, names: list[str]) -> list[Lane]:
    """One stream per name beside `keys.requests` (`<requests>:<name>`); the jobs' keys stay shared, so a
    job id means one job whichever lane it was queued in."""
    if len(set(names)) != len(names) or not all(names):
        raise ValueError(f"lane names must be distinct and non-empty: {names}")
    return [Lane(replace(keys, requests_stream=keys.lane(name)), group) for name in names]

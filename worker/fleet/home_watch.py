"""Keeps a worker's home shards current: re-reads the registry every few seconds and moves HomeFirst's
home set to what rendezvous hashing over the live workers gives this one (home_shards.py).

Peers are the live workers (a record in the registry, not draining) of the same consumer group reading
the same streams, so workers of another model or another shard layout do not take shards from this one;
this worker counts itself in even before its first heartbeat is visible. A worker that dies stops beating,
its record lapses one TTL later (3 heartbeats), and within one more interval every survivor has taken over
its shards: with the defaults (2 s heartbeats, 15 s leases) well within one lease. Until then its shards
are still read by the others (HomeFirst's stealing and patience), and its jobs are taken over as always
(XAUTOCLAIM past the lease, by every worker reading the shard).

Runs on the loop's thread between ticks (Worker.between_ticks): the policy is only touched there.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import redis
import structlog

from worker.config import WorkerConfig
from worker.fleet import registry
from worker.fleet.heartbeat import Heartbeat
from worker.fleet.home_shards import home_shards
from worker.intake.home_first import HomeFirst
from worker.keys import Keys
from worker.run.metrics import Metrics

if TYPE_CHECKING:
    from worker.run.loop import Worker

log = structlog.get_logger("conveyor.worker")
# Rounds with room a non-home shard may go unread while the home shards have work: rare probes keep it
# served (intake/read_policy.py) without stealing much from live owners; ownership moves take over.
PATIENCE = 64


class HomeWatch:
    def __init__(
        self,
        client,
        keys: Keys,
        policy: HomeFirst,
        *,
        consumer: str,
        group: str,
        streams: list[str],
        interval_s: float,
        metrics: Metrics | None = None,
        heartbeat: Heartbeat | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client, self.keys, self.policy = client, keys, policy
        self.consumer, self.group, self.streams = consumer, group, list(streams)
        self.interval_s, self.metrics, self.heartbeat, self.clock = interval_s, metrics, heartbeat, clock
        self._last: float | None = None
        self._counted = (0, 0)  # policy.from_home, policy.stolen already added to the metrics
        self.peers: list[str] = [consumer]
        self._last_home: set[int] | None = None

    def __call__(self) -> None:
        """Between ticks: refresh when an interval has passed since the last refresh."""
        now = self.clock()
        if self._last is not None and now - self._last < self.interval_s:
            return
        self._last = now
        try:
            self.refresh(registry.read(self.client, self.keys))
        except redis.RedisError as exc:  # keep the home set; the loop notices a lost Redis on its own
            log.warning("could not read the worker registry; home shards unchanged", error=str(exc))

    def refresh(self, members: list[registry.Member]) -> bool:
        """Move the home set to this worker's share among the live peers in `members`; returns whether it
        changed."""
        peers = {
            r.consumer
            for r in registry.live(members)
            if r.group == self.group and r.streams == self.streams and not r.draining
        }
        peers.add(self.consumer)
        self.peers = sorted(peers)
        owned = home_shards(self.policy.lanes, self.peers)
        home = owned[self.consumer]
        records = {r.consumer: r for r in registry.live(members)}
        full = {name for name, r in records.items() if r.full}
        peers_with_room = {
            name: records[name]
            for name in owned
            if name != self.consumer and name in records and name not in full
        }
        limits = self._excess(peers_with_room, owned)
        # Shards whose owner has no room, or has left (its record lapsed): their jobs would wait; those of
        # an owner with more queued than room, up to the excess.
        self.policy.set_stealable(
            {
                k
                for name, mine in owned.items()
                if name != self.consumer and (name in full or name not in records)
                for k in mine
            }
            | set(limits),
            limits,
        )
        changed = self.policy.move_home(home) and self._last_home is not None  # not the first set
        self._last_home = home
        if changed:
            log.info("home shards moved", home=sorted(home), workers=len(self.peers))
        if self.heartbeat is not None:
            self.heartbeat.set_home_shards(sorted(home))
        if self.metrics is not None:
            self.metrics.home_shards.set(len(home))
            if changed:
                self.metrics.ownership_changes.inc()
            home_n, stolen_n = self.policy.from_home, self.policy.stolen
            self.metrics.jobs_read("home", home_n - self._counted[0])
            self.metrics.jobs_read("stolen", stolen_n - self._counted[1])
            self._counted = (home_n, stolen_n)
        return changed

    def _excess(self, peers: dict[str, registry.WorkerRecord], owned: dict[str, set[int]]) -> dict[int, int]:
        """Per shard of a peer with more unread jobs in its shards (the group's lag, read now) than the
        room its record shows, how many of that shard's may be stolen: the excess would wait for it while
        this worker may have room. A record is up to two intervals old, so an owner taking its jobs a
        slot at a time still looks as if it had room; the lag does not. The excess is taken from the
        shards with the most queued first. Lags Redis cannot tell (None) count as none."""
        if not peers:
            return {}
        names = sorted(peers)
        lanes = [k for name in names for k in sorted(owned[name])]
        try:
            pipe = self.client.pipeline(transaction=False)
            for k in lanes:
                pipe.xinfo_groups(self.streams[k])
            replies = pipe.execute(raise_on_error=False)
        except redis.RedisError as exc:
            log.warning("could not read the shards' backlogs; stealing by the records alone", error=str(exc))
            return {}
        lag = {k: group_lag(reply, self.group) for k, reply in zip(lanes, replies, strict=True)}
        limits: dict[int, int] = {}
        for name in names:
            excess = sum(lag[k] for k in owned[name]) - peers[name].free
            for k in sorted(owned[name], key=lambda k: -lag[k]):
                if excess <= 0:
                    break
                limits[k] = min(lag[k], excess)
                excess -= limits[k]
        return limits


def group_lag(reply, group: str) -> int:
    """Entries of a stream not yet delivered to `group`, from its XINFO GROUPS reply (0 when unknown)."""
    if isinstance(reply, Exception):  # no such stream yet: nothing queued
        return 0
    for info in reply:
        name = info.get("name")
        if (name.decode() if isinstance(name, bytes) else name) == group:
            return int(info.get("lag") or 0)
    return 0


def use_home_shards(w: Worker, client, cfg: WorkerConfig, heartbeat: Heartbeat | None = None) -> HomeWatch:
    """`--affinity`: read `w`'s lanes (a lane per shard) with HomeFirst, its home set kept current between
    ticks. Until the first refresh (at the first tick) every shard is home."""
    lanes = len(w.lanes)
    policy = HomeFirst(lanes, set(range(lanes)), patience=PATIENCE)
    w.use_policy(policy)
    watch = HomeWatch(
        client,
        cfg.keys,
        policy,
        consumer=cfg.consumer,
        group=cfg.group,
        streams=[lane.stream for lane in w.lanes],
        interval_s=cfg.registry_interval_s,
        metrics=w.metrics,
        heartbeat=heartbeat,
    )
    w.between_ticks.append(watch)
    # Idle, it wakes for each refresh: a peer that fills up is stolen from within an interval.
    w.idle_block_ms = max(1, min(w.idle_block_ms, int(cfg.registry_interval_s * 1000)))
    return watch

"""How many new jobs each lane's read may take this round: the read policy over a worker's lanes.

A lane (intake/lanes.py) is one request stream and its consumer group. Every round, the worker knows
its room (jobs the engine can start now, less those already on their way in) and asks its policy how to
split it:
`shares(room)` gives one count per lane, and each lane's XREADGROUP asks for at most that many entries.
After the replies, `read_back(lane, asked, got)` tells the policy what each read found, and
`charge(lane, cost)` what service a lane's jobs were given (tokens), for policies that count it.

Layouts and policies for what the worker must carry (docs/protocol.md, "Lanes"):
- one stream (protocol version 1): one lane, `OneLane`;
- Redis Cluster shards (version 2): a lane per shard, `worker.intake.read_shares.ReadShares`;
- a stream per served model: a worker has one lane, its model's stream, `OneLane`;
- home shards with stealing: a lane per shard, `home_first.HomeFirst`;
- priority lanes: a lane per priority level, `priority_lanes.PriorityLanes`;
- tenant fair share: a lane per tenant, `fair_share.FairShare`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod


class ReadPolicy(ABC):
    """The contract every policy keeps (`shares` enforces the first two for the policies that opt in):

    1. Never more than the room. The reads of one round together take at most `room` entries (the
       jobs the engine can start now, less those on their way in: Worker.room_left, LaneRun.reserved).
       `shares(room)` returns per lane a cap >= 0 and <= room, and the worker reads its lanes in the
       cycle's order, each capped by its share and by what the lanes before it left of the room
       (Worker.tick), so the rounds of one tick, built before any is answered, cannot together start
       more than the engine has room for. Policies here split exactly (the caps sum to at most `room`).
    2. Never starves a lane forever. A lane with entries waiting is given a share > 0 within a bounded
       number of rounds that have room, however much work the other lanes have. With `patience` set, the
       base class guarantees it: a lane given nothing for `patience` such rounds is given one entry
       first, before the policy splits the rest (bound: `patience` + lanes rounds). A policy without
       `patience` states its own bound.
    3. "Oldest first". Inside a lane, XREADGROUP hands out entries in id order, so each lane is FIFO
       and no policy reorders it. Across lanes, entry ids do not compare (different streams, and in a
       cluster different servers' clocks), so no policy promises a global FIFO: among lanes a policy
       ranks equal (same priority level, same fair-share counter, both home), the lane that has waited
       longest since its last share goes first (`waited`).

    `hungry[k]` is what the last read of lane k says: it came back with all it asked for, so it
    probably has more. A lane never read is not hungry unless a policy starts it so.

    Policies that probe lanes whose last read was short (one entry each, so that new work is seen) ask
    `may_probe`: a round's probes do not follow a round whose probes all found nothing. A probe's entry
    is room taken until its reply: the step that follows runs without it. Probing in every round with
    room, empty lanes took a slot of every refill and, when one slot freed at a time, every slot (a
    cluster worker, 8 sequences, 160 jobs of 2-12 tokens on one shard: 209 steps, 193 this way). So the
    hungry lanes get at least every other round's room, and a lane with new work is still found within
    two rounds with room per short lane, at once while the probes find work.
    """

    def __init__(self, lanes: int, patience: int | None = None) -> None:
        if lanes < 1:
            raise ValueError("a read policy needs at least one lane")
        if patience is not None and patience < 1:
            raise ValueError("patience must be >= 1 round")
        self.patience = patience
        self.hungry = [False] * lanes
        self.waited = [0] * lanes  # rounds with room since the lane was last given a share
        # Lanes the last split probed, whether any of those reads found an entry, and whether the split
        # under way may probe (see the class docstring).
        self._probed: set[int] = set()
        self._probe_found = False
        self._may_probe = True

    @property
    def lanes(self) -> int:
        return len(self.hungry)

    def shares(self, room: int, first: int = 0) -> list[int]:
        """Per lane, the most entries its read may ask for this round. `first` is the lane leading this
        cycle's rotation, for policies that rotate (ReadShares); the others ignore it."""
        n = self.lanes
        if room <= 0:
            return [0] * n
        aged = [0] * n
        left = room
        if self.patience is not None:
            for k in sorted(range(n), key=lambda k: -self.waited[k]):
                if left and self.waited[k] >= self.patience:
                    aged[k], left = 1, left - 1
        self._may_probe = not self._probed or self._probe_found
        self._probed, self._probe_found = set(), False
        split = self.split(left, first) if left else [0] * n
        shares = [a + s for a, s in zip(aged, split, strict=True)]
        if len(shares) != n or min(shares) < 0 or max(shares) > room:
            raise AssertionError(f"{type(self).__name__} split {room} as {shares}: breaks its contract")
        for k, share in enumerate(shares):
            self.waited[k] = 0 if share else self.waited[k] + 1
        return shares

    @abstractmethod
    def split(self, room: int, first: int) -> list[int]:
        """The policy's own split of `room` (> 0) over the lanes; `shares` checks and ages it."""

    def read_back(self, lane: int, asked: int, got: int) -> None:
        """Lane's read asked for `asked` entries and got `got`."""
        self.hungry[lane] = got >= asked
        if got and lane in self._probed:
            self._probe_found = True

    def may_probe(self, left: int, lane: int) -> bool:
        """Whether `split` may give `lane` (its last read was short) a probe of one entry out of `left`,
        the room it has not given yet: not when the last split's probes all found nothing (see the class
        docstring). A True answer counts the probe as given."""
        if left < 1 or not self._may_probe:
            return False
        self._probed.add(lane)
        return True

    def may_read(self, lane: int) -> bool:
        """Whether this worker's reads may take from `lane` now (HomeFirst: not a live owner's shard)."""
        return True

    def backlog(self) -> bool:
        """Whether a lane this worker may read probably has entries: then it reads in rounds that do not
        block. Only readable lanes count: a hungry lane it may not read would have an idle worker poll
        Redis, round after round, for work it must not take."""
        return any(self.hungry[k] and self.may_read(k) for k in range(self.lanes))

    def idle_cap(self, lane: int) -> int | None:
        """The most entries an idle worker's blocking read of `lane` may take (None: all the room). An idle
        worker blocks on every lane in turn, outside the shares, so that no job waits while it is idle."""
        return None

    def idle_read(self, lane: int, got: int) -> None:
        """An idle worker's blocking read of `lane` (outside the shares) took `got` entries. A wait returns
        as soon as entries arrive, so a lane it found any on probably has more: it counts as a full read
        of `got`, and the rounds that follow read the lane without blocking. Left as its last round had
        (short), a backlog on one of 8 shards would be read by another idle wait each time the engine
        emptied, behind the other shards' waits."""
        if got:
            self.read_back(lane, asked=got, got=got)

    def add_lane(self) -> int:
        """A lane added at run time (a tenant first seen: run/tenant_watch.py), read as hungry at once so
        that its first jobs are found; returns its index."""
        self.hungry.append(True)
        self.waited.append(0)
        return self.lanes - 1

    def charge(self, lane: int, cost: int) -> None:  # noqa: B027 (a no-op unless a policy counts service)
        """Jobs read from `lane` were given `cost` more tokens. Ignored unless the policy shares service
        (intake/fair_share.py)."""

    def by_wait(self, lanes: list[int]) -> list[int]:
        """`lanes`, the longest waiting first (ties: in lane order): "oldest first" across lanes."""
        return sorted(lanes, key=lambda k: (-self.waited[k], k))


class OneLane(ReadPolicy):
    """One stream: all the room to lane 0 (today's single stream, a per-model stream)."""

    def __init__(self) -> None:
        super().__init__(1)

    def split(self, room: int, first: int) -> list[int]:
        return [room]

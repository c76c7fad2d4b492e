"""Home lanes first, then stealing: a lane per shard, some of them this worker's home.

Home lanes (chosen elsewhere, e.g. by rendezvous hashing over the live workers) take the room while any
of them is hungry (its last read was full), split evenly between the hungry ones, any remainder to the
longest waiting. When none is, the home lanes not read empty since a home lane last came back full
(`dry`) are read first: a lane read short long ago may have a backlog by now. Only then does the worker
steal: each home lane is probed with one entry (new work there is seen within a round), and the rest goes
to a hungry stealable lane (below). With no lane hungry at all (short queues), the longest waiting home lane
reads all the room (a worker with no home lane, when there are more workers than shards: the longest
waiting lane).

Stealing is for jobs that would otherwise wait: only from lanes in `stealable` (HomeWatch sets it to the
shards of peers with no room, per their registry records, and of peers gone; None: every lane not home),
and never while a home lane is hungry, not even the one-entry probes that keep other lanes from waiting
`patience` rounds (intake/read_policy.py). A lane that is neither home nor stealable is its live owner's
to read: it has room. An idle worker blocks on every lane in turn, taking all it has room for from a
home lane, one job from a stealable lane and none from the others (`idle_cap`). Home lanes start
hungry, and so does a lane that becomes home, so a worker reads its own backlog first. The home set
changes at run time (`move_home`, called between ticks by worker/fleet/home_watch.py as workers join and
leave). What each read took is counted as taken from home or stolen (`from_home`, `stolen`).

An owner with some room but more queued than that (HomeWatch reads the shards' backlogs) keeps the jobs
it has room for: its lanes are stealable with a limit, the backlog past its room, and stealing stops
there until HomeWatch looks again (`steal_left`).

Stealing sticks to one victim lane: the lane stolen from last is stolen from again while its reads come
back full and it stays stealable; only then does the worker pick another, the longest waiting of the
hungry stealable lanes. A stolen job whose prefix the stealer has not cached recomputes it, so jobs
stolen from one shard (a few prefixes) cost a few prefix computations, where stealing from every
stealable shard in turn costs one per job.

A shard whose home worker died becomes stealable, then another worker's home, within one registry TTL
plus one interval (worker/fleet/home_watch.py): within one lease with the defaults.

    room 6, home {0, 1}, hungry {1, 2}                  ->  [0, 6, 0]
    room 6, home {0, 1}, hungry {2}, lane 0 not read    ->  [6, 0, 0]
    room 6, home {0, 1}, hungry {2}, both read empty    ->  [1, 1, 4]
"""

from __future__ import annotations

from worker.intake.read_policy import ReadPolicy


class HomeFirst(ReadPolicy):
    def __init__(self, lanes: int, home: set[int], patience: int = 16) -> None:
        super().__init__(lanes, patience)
        self.home: set[int] = set()
        self.move_home(home)
        self.stealable: set[int] | None = None  # None: every lane not home
        self.steal_left: dict[int, int] = {}  # stealable lanes with a limit: how many more may be stolen
        self.from_home = 0  # jobs read from home lanes
        self.stolen = 0  # jobs read from other lanes
        self.victim: int | None = None  # the lane stolen from last, stolen from first while it has more
        self.dry: set[int] = set()  # home lanes read short since a home lane last read full

    def move_home(self, home: set[int]) -> bool:
        """Read `home` first from the next round on; returns whether the set changed."""
        if not home <= set(range(self.lanes)):
            raise ValueError(f"home lanes {sorted(home)} are not a subset of 0..{self.lanes - 1}")
        for k in set(home) - self.home:
            self.hungry[k] = True  # read at once: a new home lane may hold a backlog (not stolen first)
        changed, self.home = set(home) != self.home, set(home)
        return changed

    def read_back(self, lane: int, asked: int, got: int) -> None:
        super().read_back(lane, asked, got)
        self._count(lane, got)
        if lane in self.home:
            if got >= asked:
                self.dry.clear()  # work at home: the other home lanes may have some too by now
            else:
                self.dry.add(lane)

    def set_stealable(self, lanes: set[int], limits: dict[int, int] | None = None) -> None:
        """Lanes whose owner has no room or has left (worker/fleet/home_watch.py). A lane that becomes
        stealable starts hungry, so the worker tries it in its next round instead of waiting for an idle
        turn on it or for patience's probe. `limits[k]`: steal at most this many from lane k until the
        next call (an owner with some room keeps the jobs it has room for); lanes not in it: no limit."""
        before = set(range(self.lanes)) if self.stealable is None else self.stealable
        for k in set(lanes) - before - self.home:
            self.hungry[k] = True
        self.stealable = set(lanes)
        self.steal_left = dict(limits or {})

    def may_steal(self, lane: int) -> bool:
        return (
            lane not in self.home
            and (self.stealable is None or lane in self.stealable)
            and self.steal_left.get(lane, 1) > 0
        )

    def may_read(self, lane: int) -> bool:
        return lane in self.home or self.may_steal(lane)

    def shares(self, room: int, first: int = 0) -> list[int]:
        shares = super().shares(room, first)
        home_hungry = any(self.hungry[k] for k in self.home)
        for k in range(self.lanes):
            if k not in self.home and (home_hungry or not self.may_steal(k)):
                shares[k] = 0
        return shares

    def idle_cap(self, lane: int) -> int | None:
        """Idle, a worker takes all it has room for from a home lane and one job from a stealable one:
        it is busy then, reads its home lanes first, and steals more only when they are short. A burst
        arriving at idle workers is not scattered over whichever lane each was blocked on."""
        if lane in self.home or not self.home:
            return None
        return 1 if self.may_steal(lane) else 0

    def idle_read(self, lane: int, got: int) -> None:
        self._count(lane, got)
        if got:  # it had entries, maybe more: the next rounds read it (a stolen one is stolen from again)
            self.hungry[lane] = True
            if self.may_steal(lane):
                self.victim = lane

    def _count(self, lane: int, got: int) -> None:
        if lane in self.home:
            self.from_home += got
        else:
            self.stolen += got
            if lane in self.steal_left:
                self.steal_left[lane] = max(0, self.steal_left[lane] - got)

    def split(self, room: int, first: int) -> list[int]:
        shares = [0] * self.lanes
        home = self.by_wait(sorted(self.home))
        hungry_home = [k for k in home if self.hungry[k]]
        if hungry_home:
            each, extra = divmod(room, len(hungry_home))
            for i, k in enumerate(hungry_home):
                shares[k] = each + (1 if i < extra else 0)
            return shares
        others = self.by_wait([k for k in range(self.lanes) if self.hungry[k] and self.may_steal(k)])
        unchecked = [k for k in home if k not in self.dry]
        if others and unchecked:  # before stealing, read the home lanes not found empty since home had work
            each, extra = divmod(room, len(unchecked))
            for i, k in enumerate(unchecked):
                shares[k] = each + (1 if i < extra else 0)
            return shares
        if self.victim in others:  # keep stealing from the same lane (its prefixes are cached here now)
            others.remove(self.victim)
            others.insert(0, self.victim)
        self.victim = others[0] if others else self.victim
        if not others:
            shares[(home or self.by_wait(list(range(self.lanes))))[0]] = room
            return shares
        left = room
        for k in home:
            if left > 1:  # probes, leaving at least one entry to steal
                shares[k], left = 1, left - 1
        shares[others[0]] = min(left, self.steal_left.get(others[0], left))
        return shares

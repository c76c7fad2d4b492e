"""The read policy of Redis Cluster's shards (a lane per shard, intake/read_policy.py): the room goes to one
shard at a time.

A cycle's rounds are all built before any is answered, so a read in flight counts as taken room
(Worker.reserved) and together they cannot take more than the engine has room for; a read that finds
nothing wastes its share until the next cycle. A shard is "hungry" when its last read came back with all
it asked for (it probably has more).

The engine's room goes to one hungry shard at a time, its *turn*, until it has read a turn's worth of
jobs (the most room seen: about one engine-full) or comes back short; then the next hungry shard in index
order takes over. So a worker's batch is made of few shards, and each step writes a few script calls
carrying many events each rather than one per shard carrying a few: Redis's cost per call (a MULTI/EXEC
round, an EVALSHA, a read and a reply) is paid per shard in a step. Shared evenly at every refill, a
batch would soon span every shard, close to doubling the script calls per event (benchmarks/redis_scale.py
counts them). Every hungry shard gets its turn in order, so none starves.

The shards that are not hungry are probed with one job of the room, one a cycle, the longest waiting
first, but not in a cycle after a probe that found nothing (ReadPolicy.may_probe): each notices new
work within about two cycles with room per such shard (one while the probes find work), and a full
probe makes it hungry. Before, the rotation's first shard was probed in every cycle with room: when
one slot freed at a time, the probes of 7 empty shards took it in 7 cycles of 8, and the hungry shard's
refill came in pieces as the rotation came round to it. With no hungry shard (short queues)
the first in the rotation may read all the room: one read per cycle, not one per shard per cycle on
streams that are mostly empty, and any shard's new work is seen within one rotation.

    room 8, 4 shards, shards 2 and 3 hungry, turn at 2, shard 0 waited longest  ->  [1, 0, 7, 0]
    ... shard 2 has read 8 (a turn's worth), shard 0's probe found nothing      ->  [0, 0, 0, 8]
"""

from __future__ import annotations

from worker.intake.read_policy import ReadPolicy


class ReadShares(ReadPolicy):
    """No lane starves: a hungry shard waits at most one turn per other hungry shard; a shard that is not
    hungry is probed within two cycles with room per such shard."""

    def __init__(self, shards: int, turn: int = 0) -> None:
        super().__init__(shards)
        self.turn = turn  # the hungry shard the room goes to
        self.taken = 0  # jobs it read since its turn began
        self.quota = 1  # a turn's worth: the most room seen

    def split(self, room: int, first: int) -> list[int]:
        """Per shard, the most jobs its read may ask for this cycle; `first` leads the cycle's order."""
        n = len(self.hungry)
        self.quota = max(self.quota, room)
        if not any(self.hungry):  # short queues: the first in the rotation may take it all
            return [room if k == first else 0 for k in range(n)]
        if not self.hungry[self.turn]:
            self._next_turn()
        shares = [0] * n
        short = self.by_wait([k for k in range(n) if not self.hungry[k]])
        if short and self.may_probe(room, short[0]):
            shares[short[0]] = 1
        shares[self.turn] = room - sum(shares)
        return shares

    def read_back(self, shard: int, asked: int, got: int) -> None:
        """Shard's read asked for `asked` jobs and got `got`."""
        super().read_back(shard, asked, got)
        if shard != self.turn:
            return
        self.taken += got
        if self.taken >= self.quota or not self.hungry[shard]:
            self._next_turn(after=shard)

    def _next_turn(self, after: int | None = None) -> None:
        """The next hungry shard after `after` (default: after the current turn), else stay."""
        n = len(self.hungry)
        start = self.turn if after is None else after
        for step in range(1, n + 1):
            k = (start + step) % n
            if self.hungry[k]:
                self.turn = k
                break
        self.taken = 0

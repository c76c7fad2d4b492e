"""Priority lanes: a lane per priority level, lane 0 first (smaller priorities run first across the queue).

A worker that reads a single stream orders only what it has already taken: a job with priority 0 queued
behind eight jobs of priority 10 waits for them. With a lane per level, the room goes to the
levels in order: a hungry lane (its last read was full) takes all that is left; a lane that came back
short is drained, and is probed with one entry so that new work is seen (a full probe makes it hungry
again), but not in a round after one whose probes all found nothing (ReadPolicy.may_probe: a probe's
entry is room the levels below do not get for a step). Lower levels get what the higher ones leave.

No level starves: a lane given nothing for `patience` rounds with room is given one entry first
(intake/read_policy.py), so a level below a flood still moves, one job per `patience` rounds at least.

    room 8, lanes [hungry, hungry, hungry]            ->  [8, 0, 0]
    room 8, lanes [short, hungry, hungry]             ->  [1, 7, 0]
"""

from __future__ import annotations

from worker.intake.read_policy import ReadPolicy


class PriorityLanes(ReadPolicy):
    def __init__(self, levels: int, patience: int = 8) -> None:
        super().__init__(levels, patience)
        self.hungry = [True] * levels  # unknown: read as if full until a read says otherwise

    def split(self, room: int, first: int) -> list[int]:
        shares = [0] * self.lanes
        left = room
        for k in range(self.lanes):
            if left == 0:
                break
            if self.hungry[k]:
                shares[k] = left
            elif (left > 1 or self.waited[k] >= 1) and self.may_probe(left, k):
                shares[k] = 1
            left -= shares[k]
        return shares

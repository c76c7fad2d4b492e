"""How many new jobs each shard's round may ask for in one cycle.

A cycle's rounds are all built before any is answered, so a read in flight counts as taken room
(Worker.reserved) and together they cannot take more than the engine has room for; a read that finds
nothing wastes its share until the next cycle. So the room goes to the "hungry" shards (whose last read
came back with all it asked for: they probably have more), shared evenly; a shard that is not hungry asks
for one job when it is first in the cycle's rotating order (so it notices new work within one rotation,
and a full read makes it hungry), and for nothing otherwise. With no hungry shard, the room is shared
evenly over all.

    room 8, 4 shards, shard 2 hungry, shard 0 first  ->  [1, 0, 8, 0]   (reads in flight cap the total)
"""

from __future__ import annotations

import math


def read_shares(room: int, hungry: list[bool], first: int) -> list[int]:
    if room <= 0:
        return [0] * len(hungry)
    many = sum(hungry)
    if many == 0:
        return [math.ceil(room / len(hungry))] * len(hungry)
    return [math.ceil(room / many) if h else int(k == first) for k, h in enumerate(hungry)]

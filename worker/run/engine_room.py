"""How many new jobs an engine can start now: what the loop reads for and what peers steal by.

0 while a job waits in the engine (it could not start even that one); else the free sequence slots,
capped by the free KV blocks at the running jobs' current use each (a job sharing a cached prefix uses
few blocks of its own, so a pool full of one prefix's jobs still has room for more of them).
"""

from __future__ import annotations

import math

from engine.client import EngineClient
from engine.outputs import EngineStats


def engine_room(engine: EngineClient, stats: EngineStats) -> int:
    """`stats`: the engine's, just read (callers have them at hand; a remote engine's cost a call)."""
    if stats.num_waiting > 0:
        return 0
    free_slots, free_blocks = engine.free_capacity()
    per_job = max(1, math.ceil(stats.num_kv_blocks_used / stats.num_running)) if stats.num_running else 1
    return max(0, min(free_slots, free_blocks // per_job))

"""An idle worker's wait on several lanes of one Redis: one blocking XREADGROUP over all their streams.

A worker idle on every lane (run/loop.py) would otherwise block on each lane's stream in
turn for block_ms / lanes: on Redis 7.0 at hz 10 a short BLOCK lasts ~100 ms at least, so a job arriving
on the lane just passed waits up to (lanes - 1) x 100 ms (8 shards: ~0.8 s). When the lanes share one
client (one Redis), one group and one consumer name, XREADGROUP takes them all at once and returns as soon
as any has an entry:

    XREADGROUP GROUP g c COUNT n BLOCK block_ms STREAMS s0 s1 .. sk  > > .. >

COUNT is per stream, so n = room // lanes keeps the read within the room. Each lane's idle cap (the read
policy's `idle_cap`) applies too: a lane capped at 0 (a live owner's shard, under HomeFirst) is left out,
and COUNT is at most the smallest cap given, one count serving every stream (the rounds after the wait
read the rest). Each entry goes to its lane's `arrived` list, as a round's read would put it
(intake/stream_reader.py).
"""

from __future__ import annotations

import redis

from worker.connection import with_retry
from worker.intake.stream_reader import Reader
from worker.wire.exchange import execute_plain
from worker.wire.job_record import Arrived
from worker.wire.round import Round


def wait_on_lanes(
    readers: list[Reader],
    arrived: list[list[Arrived]],
    room: int,
    block_ms: int,
    caps: list[int | None] | None = None,
) -> bool:
    """Block until any lane has entries (up to block_ms), appending them to `arrived[k]` for lane k.
    `caps[k]`: the most lane k may take (None: no cap of its own; 0: not read). Returns False (nothing
    read) when the lanes cannot be read together, no lane may be read, or room < the lanes read."""
    caps = caps if caps is not None else [None] * len(readers)
    if len(caps) != len(readers):
        raise ValueError(f"{len(caps)} idle caps for {len(readers)} lanes")
    lanes = [k for k, cap in enumerate(caps) if cap != 0]
    if not lanes:
        return False
    same = {(id(readers[k].client), readers[k].cfg.group, readers[k].cfg.consumer) for k in lanes}
    count = min([room // len(lanes)] + [cap for cap in caps if cap])
    if len(same) != 1 or count < 1:
        return False
    first = readers[lanes[0]]
    lane_of = {readers[k].cfg.keys.requests.encode(): k for k in lanes}
    if len(lane_of) != len(lanes):
        return False  # two lanes on one stream: a single read cannot tell them apart

    def handle(reply) -> None:
        if isinstance(reply, Exception):
            if str(reply).startswith("NOGROUP"):
                return
            raise reply
        for stream, entries in reply or []:
            name = stream if isinstance(stream, bytes) else stream.encode()
            arrived[lane_of[name]].extend(Arrived(eid, fields) for eid, fields in entries)

    rnd = Round()
    streams = {readers[k].cfg.keys.requests: ">" for k in lanes}
    rnd.add(
        lambda p: p.xreadgroup(first.cfg.group, first.cfg.consumer, streams, count=count, block=block_ms),
        handle,
    )
    # Blocking reads cannot run inside MULTI: a plain pipeline. Idle, so any stop request ends the wait.
    results = with_retry(
        lambda: execute_plain(first.client, rnd),
        "waiting for jobs",
        first.idle_stop,
        first.backoff,
        first.health,
    )
    if any(isinstance(r, redis.ResponseError) and str(r).startswith("NOGROUP") for r in results):
        for k in lanes:  # Redis restarted without persistence: a group is gone
            readers[k].ensure_group()
    rnd.dispatch(results)
    return True

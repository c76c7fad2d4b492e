"""Taking over jobs whose worker's lease lapsed (crashed, frozen or cut off from Redis).

XAUTOCLAIM moves entries idle longer than the lease to this consumer; they then go through admission like
new ones, where the attempt counter, the owner key and the output stream decide whether and where to
resume (job_path.py, recover/resume_point.py).
"""

from __future__ import annotations

from collections.abc import Callable

from worker.config import WorkerConfig
from worker.wire.job_record import Arrived
from worker.wire.round import Round


class Reclaimer:
    """Walks the group's pending list with XAUTOCLAIM's cursor, one slice per call, wrapping at the end."""

    def __init__(self, cfg: WorkerConfig) -> None:
        self.cfg = cfg
        self.cursor: bytes | str = "0-0"

    def add(self, rnd: Round, count: int, on_arrived: Callable[[list[Arrived]], None]) -> None:
        cfg = self.cfg

        def handle(result) -> None:
            if isinstance(result, Exception):  # NOGROUP after a Redis restart: the next read recreates it
                return
            # [next_start_id, [(id, fields), ...], [deleted ids]]
            self.cursor = result[0]
            on_arrived([Arrived(eid, fields, reclaimed=True) for eid, fields in result[1]])

        start = self.cursor
        rnd.add(
            lambda p: p.xautoclaim(
                cfg.keys.requests, cfg.group, cfg.consumer, cfg.lease_ms, start, count=count
            ),
            handle,
        )

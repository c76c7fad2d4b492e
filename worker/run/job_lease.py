"""Leases on in-flight jobs, so a crashed worker's jobs are taken over after `lease_ms`, not after the
longest generation.

Two marks per job, both renewed by `add_renewal` every lease/3:
- the entry's idle time in the group's pending list, reset with XCLAIM ... JUSTID (which does not count
  a delivery); XAUTOCLAIM elsewhere takes entries idle longer than the lease (see recover/takeover_claim.py);
- the owner key `<prefix>:owner:<id>` = consumer name, expiring with the lease, so enqueuing an id that
  is running does not start a second generation (taken with SET NX in the job's lookups, job_path.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial
from typing import Any

from worker.config import WorkerConfig
from worker.wire.job_record import InFlight
from worker.wire.round import Round


def add_renewal(rnd: Round, cfg: WorkerConfig, jobs: Iterable[InFlight]) -> None:
    jobs = [j for j in jobs if not j.dropped]
    if not jobs:
        return
    for job in jobs:
        rnd.add(partial(_set_owner, key=cfg.keys.owner(job.job_id), cfg=cfg))
    ids = [j.entry_id for j in jobs]
    rnd.add(lambda p: p.xclaim(cfg.keys.requests, cfg.group, cfg.consumer, 0, ids, justid=True))


def _set_owner(p: Any, key: str, cfg: WorkerConfig) -> None:
    p.set(key, cfg.consumer, px=cfg.lease_ms)


def add_release(rnd: Round, cfg: WorkerConfig, job_id: str) -> None:
    key = cfg.keys.owner(job_id)
    rnd.add(lambda p: p.delete(key))

"""Jobs that survived a crash run alone, so a job that kills its worker is charged for it, not its batch.

Attempts are counted before a job runs (`HINCRBY <prefix>:attempts <id>`), so a crash counts; but a crash
counts for every job in the batch that died with the worker. A job whose count is above zero when it is
admitted (an earlier attempt never finished: its worker died or lost its lease) is a suspect:
- it is admitted only when this worker runs no other job, and nothing else is admitted while it runs;
  what arrives meanwhile is held (its owner key released, its entry still pending for us) and taken in
  again once the worker is empty;
- its start sets the field `<id>/alone` (keys.alone_field), saying an attempt ran alone.
A job is dead-lettered with `too_many_attempts` only once it has used `--max-attempts` and one of those
attempts ran alone. An innocent job that died in a poisoned batch therefore gets a run of its own, and the
poisoned job, run alone, is charged for the crash it causes. A job that only ever shared batches runs at
most once more than `--max-attempts`.

A warm stop gives back the attempts of the jobs it leaves unfinished (`add_refund`): a drained job did
not crash anything, and should not run alone (one at a time) on the next worker.
"""

from __future__ import annotations

from dataclasses import replace

from worker.config import WorkerConfig
from worker.job_path import Arrived
from worker.wire.job_record import InFlight
from worker.wire.round import Round


class Isolation:
    def __init__(self, inflight: dict[str, InFlight]) -> None:
        self.inflight = inflight
        self.alone: str | None = None  # id of the suspect running alone, while it runs
        self.held: list[Arrived] = []  # arrived while they could not be admitted

    def running_alone(self) -> bool:
        return self.alone is not None and self.alone in self.inflight

    def must_wait(self, suspect: bool) -> bool:
        """A suspect waits for an empty worker; anything waits while a suspect runs alone."""
        return self.running_alone() or (suspect and bool(self.inflight))

    def hold(self, arrived: Arrived) -> None:
        # Taken in again as "reclaimed": should another worker have claimed it meanwhile, its live owner
        # means "not ours now", not "a duplicate to acknowledge".
        self.held.append(replace(arrived, reclaimed=True))

    def release(self) -> list[Arrived]:
        """The held jobs, once nothing runs here."""
        if self.inflight or not self.held:
            return []
        held, self.held = self.held, []
        return held


def add_refund(rnd: Round, cfg: WorkerConfig, job_id: str) -> None:
    """A warm stop left this job unfinished: its attempt does not count."""
    rnd.add(lambda p: p.hincrby(cfg.keys.attempts, job_id, -1))

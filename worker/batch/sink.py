"""Where a batch run's output lines go, and what an earlier run of the same batch already answered.

Two kinds: local files (`conveyor batch`, worker/batch/file_sink.py) and Redis lists written under a lease
(the HTTP API's batches, worker/batch/redis_sink.py). The runner (worker/batch/runner.py) is the same for both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from worker.batch.resume import Answered


@dataclass(frozen=True)
class Stop:
    """Why a run stops taking lines: every line not answered yet gets an error line with this code."""

    code: str  # batch_cancelled | batch_expired
    message: str


# Also the line of a job the workers stopped at the window's end (worker/batch/output_line.py).
EXPIRED = Stop("batch_expired", "this request could not be run before the batch's completion window ended")


class Sink(Protocol):
    def answered(self) -> Answered:
        """What earlier runs wrote: those custom_ids are skipped (and duplicate lines not written twice)."""
        ...

    def started(self, total: int, skipped: int) -> None:
        """The run's line count, and how many of them earlier runs answered."""
        ...

    def write(self, custom_id: str, line: str, ok: bool, tokens: int) -> None:
        """One output line (whole, with its newline). May raise to end the run (a lost lease)."""
        ...

    def stop(self) -> Stop | None:
        """Checked between reads: a reason to stop taking lines (cancelled, past the deadline), or None."""
        ...

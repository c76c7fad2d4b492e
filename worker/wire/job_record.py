"""What the worker remembers about one job it is running, and the stages of a job's path (job_path.py)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NamedTuple

from worker.protocol import Job


class Stage(str, enum.Enum):
    """Where a job is on its path; job_path.py draws them and makes every transition."""

    READ = "read"
    ADMITTED = "admitted"
    RESUMED = "resumed"  # admitted with the tokens an earlier attempt published
    REFUSED = "refused"
    DUPLICATE = "duplicate"
    LEFT = "left"
    RUNNING = "running"
    FINISHED = "finished"
    ACKNOWLEDGED = "acknowledged"


@dataclass(frozen=True)
class Arrived:
    """A READ job: an entry taken from a lane, not looked up yet."""

    entry_id: bytes
    fields: dict[bytes, bytes] | None  # None: the entry was trimmed away while pending
    # From our own pending list or XAUTOCLAIM: a live owner elsewhere means "not yet", not "duplicate".
    reclaimed: bool = False


class SampleEnd(NamedTuple):
    finish_reason: str
    text: str
    num_output_tokens: int


@dataclass(eq=False)
class InFlight:
    job: Job
    entry_id: bytes  # on the requests stream; acknowledged with the terminal event
    enqueued_ms: float  # the entry id's time part (Redis server clock)
    admitted_ms: float
    n: int
    next_seq: int  # sequence number of the next event on the output stream (entry id 0-<seq>)
    prompt_tokens: int = 0
    first_token_ms: float | None = None
    # sample index -> how it ended, filled as samples finish
    finished: dict[int, SampleEnd] = field(default_factory=dict)
    stop_reason: str | None = None  # "cancel" | "deadline" once aborted by the worker
    ttl_set_at: float | None = None  # time.monotonic() of the output stream's last EXPIRE
    error: str | None = None  # a sample ended in an engine error (its grammar failed): error event, not done
    error_code: str | None = None  # its code: invalid_params (grammar) or internal_error (a bug)
    stage: Stage = Stage.READ
    dropped: bool = False  # another worker wrote to our stream, or we are draining: publish nothing more
    engine_s: float = 0.0  # its share of the engine steps' wall time so far (worker/fleet/accounting.py)

    @property
    def job_id(self) -> str:
        return self.job.id

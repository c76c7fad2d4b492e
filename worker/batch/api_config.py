"""Settings of the HTTP API's files and batches; each field is also a `conveyor serve` option."""

from __future__ import annotations

from dataclasses import dataclass

from engine.config import knob
from worker.batch.file_store import DEFAULT_MAX_FILE_BYTES
from worker.batch.input_checks import DEFAULT_MAX_LINES


@dataclass(frozen=True)
class BatchApiConfig:
    max_file_bytes: int = knob(DEFAULT_MAX_FILE_BYTES, "largest file accepted by POST /v1/files (bytes)")
    max_lines: int = knob(DEFAULT_MAX_LINES, "most lines in a batch's input file", cli="batch-max-lines")
    lease_ms: int = knob(
        10_000,
        "a batch's lease: a dead replica's batches are taken over this long after it",
        cli="batch-lease-ms",
    )
    max_in_flight: int = knob(
        256, "jobs of one batch enqueued and not answered yet", cli="batch-max-in-flight"
    )
    max_batches: int = knob(4, "batches one replica drives at once", cli="batch-drivers")
    poll_s: float = knob(1.0, "how often a replica looks for batches without a driver", cli="batch-poll-s")
    drain_s: float = knob(
        10.0, "after a cancel or expiry, how long a batch's jobs in flight get to end", cli="batch-drain-s"
    )

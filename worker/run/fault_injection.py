"""A test-only fault: the worker process kills itself with SIGKILL, as a crash in a native library would,
in the step where a given job has tokens.

Armed only by the environment variable CONVEYOR_TEST_KILL_JOB=<job id>, read once at import. Only whoever
starts the worker process sets its environment: nothing a client writes (a job's payload, its id) can arm
it, and unset (production) it costs one comparison with None per step."""

from __future__ import annotations

import os
import signal

KILL_JOB: str | None = os.environ.get("CONVEYOR_TEST_KILL_JOB") or None


def kill_if_armed(deltas) -> None:
    if any(d.request_id == KILL_JOB for d in deltas):
        os.kill(os.getpid(), signal.SIGKILL)

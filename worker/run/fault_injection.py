"""A test-only fault: the worker process kills itself with SIGKILL, as a crash in a native library would,
in the step where a given job has tokens.

Armed only by the environment variable CONVEYOR_TEST_KILL_JOB=<job id>, read when `conveyor worker`
starts (`from_env`). Only whoever starts the worker process sets its environment: nothing a client writes
(a job's payload, its id) can arm it, and unset (production) the loop holds the no-op hooks."""

from __future__ import annotations

import os
import signal

from engine.outputs import StepDelta
from worker.run.hooks import NO_HOOKS, Hooks


class KillOnJob(Hooks):
    def __init__(self, job_id: str) -> None:
        self.job_id = job_id

    def stepped(self, deltas: list[StepDelta], sampled_wall_s: float) -> None:
        if any(d.request_id == self.job_id for d in deltas):
            os.kill(os.getpid(), signal.SIGKILL)


def from_env() -> Hooks:
    job_id = os.environ.get("CONVEYOR_TEST_KILL_JOB")
    return KillOnJob(job_id) if job_id else NO_HOOKS

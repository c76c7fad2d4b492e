"""Runs each step on every rank of an engine: the one place that sends a step to the other ranks.

    Executor(runner)           one process: the runner's step as it is
    Executor(runner, ranks)    tensor parallel, on rank 0: each step's prepared inputs go to ranks 1..N-1
                               (step_message.py: one int64 header down a pipe, one broadcast) right before
                               rank 0 runs the same forward; a lost rank surfaces as TensorParallelError

The runner only executes: it prepares the step, calls the forward it is handed, and samples. Ranks > 0
receive the inputs and call their runner's forward (rank_process.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from engine.core.scheduler_output import SchedulerOutput
from engine.distributed.step_message import StepInputs
from engine.model_runner import ModelRunner, PendingOutput

if TYPE_CHECKING:  # rank_processes spawns rank_process, which imports the runner
    from engine.distributed.rank_processes import RankProcesses


class Executor:
    def __init__(self, runner: ModelRunner, ranks: RankProcesses | None = None) -> None:
        self.runner = runner
        self.ranks = ranks

    def submit(self, sched_out: SchedulerOutput) -> PendingOutput:
        """The runner's submit (a handle on the step's sampled ids), its forward run on every rank."""
        if self.ranks is None:
            return self.runner.submit(sched_out, self.runner.forward)
        # A group that already failed fails the step before the runner lays it out: after a failed step
        # the scheduler's and the runner's views of the requests differ, and only the failure is true.
        self.ranks.check()
        return self.runner.submit(sched_out, self._forward_on_every_rank)

    def _forward_on_every_rank(self, inputs: StepInputs) -> torch.Tensor | None:
        assert self.ranks is not None
        with self.ranks.step():  # a lost rank surfaces here as TensorParallelError
            self.ranks.send(inputs)
            return self.runner.forward(inputs)

"""Rank 0's side of tensor parallelism: spawn ranks 1..N-1, join their group, send them every step, notice
when one is lost, and stop them.

    RankProcesses(config, device)      spawn (multiprocessing "spawn"), then join the group as rank 0
    with ranks.step():                 a failure inside (a dead rank, a collective timing out, anything that
        ranks.send(inputs)             leaves the ranks out of step) becomes TensorParallelError, naming
        ...forward...                  the rank and its exit code when one died; every later step raises too
    ranks.close()                      STOP to every rank, join; kill what is left (also at interpreter exit)

A lost rank is found three ways: its exit code, checked before each step (no collective started with a
dead peer); the collective failing (gloo: at once on closed sockets, after `distributed_timeout_s` for a
stuck peer); and the StepWatchdog, which ends the process if a step never returns (NCCL).
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path

import structlog
import torch

from engine.config import EngineConfig
from engine.distributed.errors import TensorParallelError
from engine.distributed.group import TPGroup, free_port, start_group, stop_group
from engine.distributed.rank_process import RankArgs, rank_main
from engine.distributed.step_message import StepInputs, send
from engine.distributed.step_watchdog import StepWatchdog

log = structlog.get_logger("conveyor.engine")

# Past the group timeout, how long a step may still run before the watchdog ends the process.
WATCHDOG_MARGIN_S = 30.0
# How long a failed step waits for a dying rank's exit code, to name it in the error.
DIAGNOSE_WAIT_S = 2.0
JOIN_TIMEOUT_S = 10.0
JOIN_POLL_S = 0.1


ANOTHER_ENGINE = (
    "another tensor-parallel engine is open in this process (torch.distributed has one default group per "
    "process): close it first (LLMEngine.close(), or open engines with `with LLMEngine(...) as engine`)"
)


class RankProcesses:
    def __init__(self, config: EngineConfig, device: torch.device) -> None:
        if torch.distributed.is_initialized():  # before spawning anything: fail at once, not at the join
            raise TensorParallelError(ANOTHER_ENGINE)
        self.size = config.tensor_parallel_size
        self.device = device
        self.timeout_s = config.distributed_timeout_s
        self.failure: str | None = None
        self._closed = False
        ctx = mp.get_context("spawn")
        address = f"127.0.0.1:{free_port()}"
        self.procs: list[BaseProcess] = []
        self.pipes: list[Connection] = []  # write ends of the header pipes, one per rank 1..N-1
        for rank in range(1, self.size):
            reader, writer = ctx.Pipe(duplex=False)
            args = RankArgs(config, rank, address, str(device), os.getpid(), reader)
            p = ctx.Process(target=rank_main, args=(args,), name=f"conveyor-tp-rank-{rank}", daemon=True)
            p.start()
            reader.close()  # the rank's copy is its own; ours would keep its EOF from coming
            self.procs.append(p)
            self.pipes.append(writer)
        atexit.register(self.close)
        self.watchdog = StepWatchdog(self.timeout_s + WATCHDOG_MARGIN_S)
        self.group = TPGroup.single()
        try:
            with self.step():
                self.group = self._join(address)
        except BaseException:
            self.close()
            raise

    def _join(self, address: str) -> TPGroup:
        """Join the group as rank 0. The join blocks until every rank has joined (or the timeout), so it
        runs on a thread while this one watches the ranks: one that dies first (a bad device, an import
        error) fails the start at once instead of after the whole timeout."""
        joined: list[TPGroup | BaseException] = []

        def join() -> None:
            try:
                joined.append(start_group(0, self.size, address, self.device, self.timeout_s))
            except BaseException as exc:
                joined.append(exc)

        thread = threading.Thread(target=join, name="conveyor-tp-join", daemon=True)
        thread.start()
        while thread.is_alive():
            thread.join(JOIN_POLL_S)
            if not joined and (dead := self._dead()):
                # The join thread is left to its timeout: a dead rank means it can never complete.
                raise TensorParallelError(f"{dead} before joining the group")
        result = joined[0]
        if isinstance(result, BaseException):
            raise result
        return result

    @property
    def pids(self) -> list[int]:
        """Process ids of ranks 1..N-1."""
        return [p.pid for p in self.procs if p.pid is not None]

    @contextmanager
    def step(self) -> Iterator[None]:
        """Run one collective section; any failure in it ends this group (see the module docstring)."""
        self.check()
        try:
            with self.watchdog.step():
                yield
        except TensorParallelError:
            raise
        except Exception as exc:
            self.failure = self._diagnose(exc)
            log.error("tensor parallelism failed", error=self.failure)
            raise TensorParallelError(self.failure) from exc
        except BaseException:  # KeyboardInterrupt, SystemExit: the ranks are left mid-step
            self.failure = "interrupted inside a tensor-parallel step"
            raise

    def check(self) -> None:
        """Raise TensorParallelError if the group already failed or a rank has exited."""
        if self.failure is None and self._closed:
            self.failure = "the tensor-parallel ranks were stopped (engine closed)"
        if self.failure is None:
            dead = self._dead()
            if dead:
                self.failure = dead
                log.error("tensor parallelism failed", error=self.failure)
        if self.failure is not None:
            raise TensorParallelError(self.failure)

    def send(self, inputs: StepInputs) -> None:
        send(self.group, self.device, self.pipes, inputs)

    def close(self) -> None:
        """Stop every rank: STOP when the group is healthy, then join; kill any left after JOIN_TIMEOUT_S."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        self.watchdog.stop()
        if self.failure is None and self.group.size > 1 and not self._dead():
            try:
                send(self.group, self.device, self.pipes, None)
            except Exception as exc:  # a rank lost while closing: it is killed below
                log.warning("could not send STOP to the tensor-parallel ranks", error=str(exc))
        for p in self.procs:
            p.join(JOIN_TIMEOUT_S if self.failure is None else 0.5)
            if p.is_alive():
                p.kill()
                p.join()
        for pipe in self.pipes:
            pipe.close()
        stop_group()

    def _dead(self) -> str | None:
        dead = [(rank, p.exitcode) for rank, p in enumerate(self.procs, 1) if p.exitcode is not None]
        return "; ".join(f"tensor-parallel rank {r} exited with code {code}" for r, code in dead) or None

    def _diagnose(self, exc: Exception) -> str:
        """Name the lost rank if one exited or is stopped; otherwise the collective's own error."""
        deadline = time.monotonic() + DIAGNOSE_WAIT_S
        while (dead := self._dead()) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if dead is not None:
            return dead
        stopped = [rank for rank, p in enumerate(self.procs, 1) if _is_stopped(p.pid)]
        if stopped:
            return (
                f"tensor-parallel rank {stopped[0]} (pid {self.procs[stopped[0] - 1].pid}) is stopped and "
                f"did not answer within {self.timeout_s:g}s: {exc}"
            )
        return f"tensor-parallel step failed (a rank did not answer within {self.timeout_s:g}s?): {exc}"


def _is_stopped(pid: int | None) -> bool:
    """Linux: the process is stopped (SIGSTOP) or traced. False when it cannot be told."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")

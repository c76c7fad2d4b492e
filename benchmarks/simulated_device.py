"""A stand-in for a GPU: the model forward and the sampler's tensor math become ops of a simulated stream
that take `device_ms` per step, while the host goes on, as a CUDA stream does.

    host                                          simulated stream (FIFO, one op at a time)
    runner.forward(step)  -> queue op, return     [ forward + sampling math: device_ms ]
    sampler.launch(...)   -> host prep, queue op  [ the sampled ids: a function of the inputs ]
    SampledIds.read()     -> wait for that op     -> the ids, as the one device-to-host copy

What stays real: the engine (scheduler, runner input layout, detokenizer, deltas) and the sampler's
per-step host bookkeeping (parameter arrays, min_tokens, the seen tokens of penalised rows, row seeds),
done as `engine.sampling.host_sampler.Sampler` does it. What is replaced: the pass over the logits. The sampled ids are
deterministic (from each row's request id and output length), so the tokens, and the work the engine
does for them, are the same whatever the scheduling mode.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable

import numpy as np
import torch

from engine.batch_view import RowView
from engine.sampling.interface import SampledIds, SamplerResult
from engine.sampling.noise import row_seeds


class SimulatedDevice:
    """One FIFO stream on a clock: an op starts when it is queued or when the op before it ends, whichever
    is later, and its result is readable `seconds` after it starts. Waiting for it sleeps until then.

    Not a background thread: a thread would share the GIL with the host, which CPython hands over when
    its holder blocks or releases it (sleeps, I/O, many torch ops) or else after the switch interval
    (5 ms), so the stand-in's ops would end late while the host runs pure Python, and the host would stall
    while the stand-in holds the GIL. A GPU has neither coupling. An op's function (the sampled ids)
    runs on the waiting thread, as host time."""

    def __init__(self) -> None:
        self._free_at = 0.0
        self.busy_s = 0.0

    def submit(self, seconds: float, fn: Callable[[], object]) -> Callable[[], object]:
        """Queue an op taking `seconds`; returns a call that waits for its result."""
        start = max(time.perf_counter(), self._free_at)
        end = self._free_at = start + seconds
        self.busy_s += seconds
        box: list[object] = []

        def wait() -> object:
            if not box:
                if (left := end - time.perf_counter()) > 0:
                    time.sleep(left)
                box.append(fn())
            return box[0]

        return wait


class SimulatedSampler:
    """TokenSampler: the host Sampler's per-step bookkeeping for real, the ids from the simulated stream."""

    def __init__(self, device: SimulatedDevice, vocab_ids: list[int]) -> None:
        self.device, self.vocab_ids = device, vocab_ids

    def launch(self, logits: torch.Tensor, view: RowView) -> SampledIds:
        view.banned()
        if not view.plain_greedy:  # what the host does for a sampled batch whatever the device
            if len(view.rep_rows):
                view.seen_index(view.rep_rows)
            row_seeds(*view.seeds_input())
        keys = list(zip(view.request_ids, view.output_len.tolist(), strict=True))
        ids = self.vocab_ids
        wait = self.device.submit(
            0.0, lambda: [ids[zlib.crc32(f"{k}/{n}".encode()) % len(ids)] for k, n in keys]
        )
        return SampledIds(None, lambda: SamplerResult(wait(), [None] * len(keys)))  # type: ignore[arg-type]


def attach(engine, device_ms: float, vocab_ids: list[int]) -> SimulatedDevice:
    """Put the stand-in under `engine`'s runner: forward, placeholder fill and sampling go to the device."""
    device = SimulatedDevice()
    runner = engine.runner
    hidden_size = 1

    def forward(inputs):
        rows = int(inputs.sample_rows.shape[0]) if inputs.meta is not None else 0
        device.submit(device_ms / 1e3, lambda: None)  # the whole step's device work, queued
        return torch.empty(rows, hidden_size) if rows else None

    def fill_placeholders(input_ids, placeholders, last) -> None:
        device.submit(0.0, lambda: None)  # on a GPU: a gather from the last step's ids, queued after it

    runner.forward = forward
    runner._fill_placeholders = fill_placeholders
    runner.sampler = SimulatedSampler(device, vocab_ids)
    return device


def idle_fraction(device: SimulatedDevice, busy_before: float, wall_s: float) -> float:
    return float(np.clip(1.0 - (device.busy_s - busy_before) / wall_s, 0.0, 1.0))

"""The activation reserve, measured: run the largest steps on a small pool and read the device's peak memory.

Before the KV pool is sized (engine/kv_sizing.py) the engine builds a throw-away runner over a pool just big
enough for these steps, and runs them through its ordinary `execute`:

    1. the longest prefill: one sequence of min(max_num_batched_tokens, max_model_len - 1) tokens
    2. the widest prefill: max_num_seqs sequences sharing max_num_batched_tokens tokens, each sampling
       (the most logits rows, with top-k/top-p so the sampler's sort runs)
    3. the largest decode batch: those sequences, one token each

reserve = peak allocated during them - allocated before - the warm-up pool's own bytes. The runner's step
buffers and sampler state are in that peak, so the real runner's copies of them are reserved for too. Not
in it: CUDA graphs' private memory pool, captured after the real pool exists.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from engine.core.scheduler_output import NewRequest, ScheduledSequence, SchedulerOutput
from engine.kv_sizing import blocks_for_tokens
from engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from engine.model_runner import ModelRunner

# Sampling that takes the sampler's heaviest path: temperature, top-k and top-p sort the logits rows.
WARMUP_PARAMS = SamplingParams(temperature=1.0, top_k=50, top_p=0.9, max_tokens=2)


class DeviceMemory(Protocol):
    """What the sizing reads of a device's memory (CudaMemory; tests give a fake)."""

    def free(self) -> int: ...  # bytes the device has free now
    def reset_peak(self) -> None: ...
    def allocated(self) -> int: ...
    def peak(self) -> int: ...  # most bytes allocated at once since reset_peak
    def release_cache(self) -> None: ...  # hand cached, unused blocks back to the device


class CudaMemory:
    def __init__(self, device: torch.device) -> None:
        self.device = device

    def free(self) -> int:
        return int(torch.cuda.mem_get_info(self.device)[0])

    def reset_peak(self) -> None:
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)

    def allocated(self) -> int:
        return int(torch.cuda.memory_allocated(self.device))

    def peak(self) -> int:
        torch.cuda.synchronize(self.device)
        return int(torch.cuda.max_memory_allocated(self.device))

    def release_cache(self) -> None:
        torch.cuda.empty_cache()


def device_memory(device: torch.device) -> DeviceMemory | None:
    """The device's memory to read: CUDA's allocator; None on the CPU, where there is none to read."""
    return CudaMemory(device) if device.type == "cuda" else None


@dataclass(frozen=True)
class WarmupPlan:
    steps: list[SchedulerOutput]
    num_blocks: int  # the warm-up pool: enough for the largest of its steps


def warmup_plan(
    max_num_batched_tokens: int, max_num_seqs: int, max_model_len: int, block_size: int
) -> WarmupPlan:
    """The three steps above, with block ids from 0 (each step's sequences own their blocks)."""
    longest = max(1, min(max_num_batched_tokens, max_model_len - 1))
    long_blocks = blocks_for_tokens(longest, block_size)
    first = _prefill(["warmup-long"], [longest], block_size, first_block=0)
    # Widest: as many sequences as the step takes, each prompt short enough to leave room for its decode.
    n = max(1, min(max_num_seqs, max_num_batched_tokens))
    each = max(1, min(max_num_batched_tokens // n, max_model_len - 1))
    ids = [f"warmup-{i}" for i in range(n)]
    wide = _prefill(ids, [each] * n, block_size, first_block=0, finished=["warmup-long"])
    # Decode: each sequence's next token, on a block of its own when the prompt filled the last one.
    per_seq = blocks_for_tokens(each, block_size)
    extra = blocks_for_tokens(each + 1, block_size) - per_seq
    decode = [
        ScheduledSequence(
            rid, 1, each, tuple(range(n * per_seq + i * extra, n * per_seq + (i + 1) * extra)), True
        )
        for i, rid in enumerate(ids)
    ]
    steps = [first, wide, SchedulerOutput(decode, n)]
    return WarmupPlan(steps, max(long_blocks, n * (per_seq + extra)))


def _prefill(
    ids: list[str], lengths: list[int], block_size: int, first_block: int, finished: list[str] | None = None
) -> SchedulerOutput:
    seqs, news, block = [], [], first_block
    for rid, length in zip(ids, lengths, strict=True):
        count = blocks_for_tokens(length, block_size)
        news.append(NewRequest(rid, [0] * length, WARMUP_PARAMS, 0, []))
        seqs.append(
            ScheduledSequence(rid, length, 0, tuple(range(block, block + count)), True, whole_table=True)
        )
        block += count
    return SchedulerOutput(seqs, sum(lengths), news, finished_ids=finished or [])


def measure_reserve(make_runner: Callable[[int], ModelRunner], memory: DeviceMemory, plan: WarmupPlan) -> int:
    """Bytes the largest steps need above what is allocated now (the weights), the runner's pool excluded.
    make_runner(num_blocks): a runner over a fresh pool of that many blocks (without CUDA graphs)."""
    memory.reset_peak()
    before = memory.allocated()
    runner = make_runner(plan.num_blocks)
    pool_bytes = runner.kv_pool.numel() * runner.kv_pool.element_size()
    for step in plan.steps:
        runner.execute(step)
    peak = memory.peak()
    del runner
    memory.release_cache()
    return max(0, peak - before - pool_bytes)

"""The measured reserve (engine/warmup.py): the warm-up's steps run through a real runner on the CPU, and a
fake allocator stands in for CUDA's peak-memory counters."""

from __future__ import annotations

import pytest
import torch

from engine.attention.backend import get_attention_backend
from engine.config import EngineConfig
from engine.distributed.group import TPGroup
from engine.distributed.rank_runner import build_rank_runner
from engine.model_loader import load_model
from engine.model_runner import ModelRunner
from engine.warmup import CudaMemory, measure_reserve, warmup_plan


class FakeMemory:
    """Allocated bytes rise by `step_bytes` per executed step; the peak is the most seen since reset."""

    def __init__(self, weights: int, step_bytes: int) -> None:
        self.now, self.high, self.step_bytes = weights, weights, step_bytes
        self.calls: list[str] = []

    def grow(self, n: int) -> None:
        self.now += n
        self.high = max(self.high, self.now)

    def reset_peak(self) -> None:
        self.calls.append("reset_peak")
        self.high = self.now

    def allocated(self) -> int:
        return self.now

    def peak(self) -> int:
        self.calls.append("peak")
        return self.high

    def release_cache(self) -> None:
        self.calls.append("release_cache")


def test_the_plan_covers_the_longest_prefill_the_widest_step_and_the_largest_decode():
    plan = warmup_plan(max_num_batched_tokens=64, max_num_seqs=8, max_model_len=40, block_size=16)
    longest, wide, decode = plan.steps
    assert [s.num_new_tokens for s in longest.sequences] == [39]  # max_model_len - 1: room to decode
    assert wide.num_batched_tokens == 64 and len(wide.sequences) == 8
    assert all(s.sample for s in wide.sequences) and wide.finished_ids == ["warmup-long"]
    assert decode.num_batched_tokens == 8 and all(s.num_new_tokens == 1 for s in decode.sequences)
    used = {b for step in plan.steps[1:] for s in step.sequences for b in s.new_block_ids}
    assert used == set(range(plan.num_blocks))  # each block once across the live sequences
    assert plan.num_blocks >= 3  # the long prompt's blocks


def test_reserve_is_the_peak_above_the_weights_less_the_warmup_pool(tiny_model_dir):
    model, spec = load_model(str(tiny_model_dir("llama")), dtype="float32", device="cpu")
    plan = warmup_plan(max_num_batched_tokens=48, max_num_seqs=4, max_model_len=64, block_size=16)
    memory = FakeMemory(weights=10_000, step_bytes=0)
    executed: list[int] = []
    pools: list[int] = []

    def make_runner(num_blocks: int) -> ModelRunner:
        runner = ModelRunner(model, spec, num_blocks, 16, "cpu", max_num_seqs=4, max_num_batched_tokens=48)
        pool = runner.kv_pool.numel() * runner.kv_pool.element_size()
        pools.append(pool)
        memory.grow(pool)
        execute = runner.execute

        def counted(step):
            out = execute(step)  # the real forward and sampler on the tiny model
            executed.append(step.num_batched_tokens)
            memory.grow(700 * step.num_batched_tokens)
            memory.grow(-700 * step.num_batched_tokens)
            assert set(out.sampled_token_ids) == {s.request_id for s in step.sequences}
            return out

        runner.execute = counted  # type: ignore[method-assign]
        return runner

    reserve = measure_reserve(make_runner, memory, plan)
    assert executed == [48, 48, 4]
    assert memory.calls == ["reset_peak", "peak", "release_cache"]
    assert reserve == 700 * 48  # the widest step's transient bytes: not the weights, not the pool
    assert pools == [plan.num_blocks * 16 * spec.num_layers * 2 * spec.num_kv_heads * spec.head_dim * 4]


class ScriptedDevice:
    """A device whose free memory and warm-up peak are given; records what the sizing asked in order."""

    def __init__(self, free: int, allocated: int, peak: int) -> None:
        self._free, self._allocated, self._peak = free, allocated, peak
        self.calls: list[str] = []

    def free(self) -> int:
        self.calls.append("free")
        return self._free

    def reset_peak(self) -> None:
        self.calls.append("reset_peak")

    def allocated(self) -> int:
        return self._allocated

    def peak(self) -> int:
        self.calls.append("peak")
        return self._peak

    def release_cache(self) -> None:
        self.calls.append("release_cache")


def test_the_engine_runs_the_warmup_then_sizes_its_pool_from_what_is_left(tiny_model_dir):
    """build_rank_runner with device memory to read (as on CUDA): the warm-up's steps run on the tiny model
    on the CPU, then the pool is kv_cache_memory x free, less the measured peak, in whole blocks."""
    block = 16 * 2 * 2 * 2 * 16 * 4  # the tiny llama's float32 block: 2 layers, 2 KV heads of 16 dims
    config = EngineConfig(
        model=str(tiny_model_dir("llama")),
        dtype="float32",
        device="cpu",
        kv_cache_memory=0.5,
        max_num_seqs=8,  # the cap (2 x 8 sequences of 4 blocks) stays above what fits
        max_num_batched_tokens=48,
        max_model_len=64,
    )
    plan = warmup_plan(48, 8, 64, 16)
    warm_pool = plan.num_blocks * block
    weights = 1 << 20
    device = ScriptedDevice(free=100 * block, allocated=weights, peak=weights + warm_pool + 10 * block + 1)
    rank = build_rank_runner(config, torch.device("cpu"), None, TPGroup.single(), memory=device)
    assert device.calls == ["reset_peak", "peak", "release_cache", "free"]
    assert rank.num_blocks == (50 * block - (10 * block + 1)) // block == 39
    assert rank.runner.num_blocks == 39


def test_no_warmup_on_the_cpu_or_with_an_explicit_byte_budget(tiny_model_dir):
    block = 16 * 2 * 2 * 2 * 16 * 4
    model = str(tiny_model_dir("llama"))
    on_cpu = build_rank_runner(
        EngineConfig(model=model, dtype="float32", device="cpu", kv_cache_memory=7 * block, max_num_seqs=4),
        torch.device("cpu"),
        None,
        TPGroup.single(),
    )
    assert on_cpu.num_blocks == 7
    device = ScriptedDevice(free=100 * block, allocated=0, peak=10**12)
    given = EngineConfig(
        model=model, dtype="float32", device="cpu", kv_cache_memory=9 * block, max_num_seqs=4
    )
    assert (
        build_rank_runner(given, torch.device("cpu"), None, TPGroup.single(), memory=device).num_blocks == 9
    )
    assert device.calls == ["free"]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_measured_reserve_covers_a_step_of_the_largest_size(tiny_model_dir):
    """The peak above the weights and pool of a real step at the warm-up's sizes is within the reserve the
    warm-up measured (the torch backend: no kernel compiles, so the check stays cheap)."""
    device = torch.device("cuda")
    backend = get_attention_backend("torch", device)
    model, spec = load_model(
        str(tiny_model_dir("llama")), dtype="float16", device=device, attention_backend=backend
    )
    sizes = {"max_num_seqs": 16, "max_num_batched_tokens": 512, "max_model_len": 256}
    plan = warmup_plan(512, 16, 256, 16)

    def make_runner(num_blocks: int) -> ModelRunner:
        return ModelRunner(model, spec, num_blocks, 16, device, backend, **sizes)

    memory = CudaMemory(device)
    reserve = measure_reserve(make_runner, memory, plan)
    assert 512 * spec.hidden_size * 2 <= reserve < 1 << 30  # at least one step's hidden states
    runner = make_runner(plan.num_blocks)
    memory.reset_peak()
    before = memory.allocated()
    for step in plan.steps:
        runner.execute(step)
    assert memory.peak() - before <= reserve * 1.05

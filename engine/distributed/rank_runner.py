"""What every rank of an engine builds before stepping, in one function: `build_rank_runner`.

    load this rank's model (its shard under tensor parallelism)  ->  max_model_len (the option, checked
    against the model)  ->  on CUDA, a warm-up at the largest steps measures their peak (engine/warmup.py)
    ->  KV block count (engine/kv_sizing.py's rule over this rank's memory; MIN over the ranks)  ->  KV pool
    ->  ModelRunner

Rank 0 (LLMEngine) and ranks 1..N-1 (rank_process.py) both call it, so every rank sizes its buffers and
its pool by the same rules. Each rank loads only its shard (`load_model(..., tp=group)`):
`ModelSpec.num_kv_heads` is then this rank's count, so its KV pool holds its own heads.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import structlog
import torch
import torch.distributed as dist

from engine.attention.backend import AttentionBackend
from engine.config import EngineConfig
from engine.distributed.group import TPGroup
from engine.kv_cache import allocate_kv_pool, bytes_per_block
from engine.kv_sizing import engine_memory, kv_pool_size, measures_reserve, most_blocks_usable
from engine.model_loader import ModelSpec, load_model
from engine.model_runner import ModelRunner
from engine.sampling.interface import TokenSampler
from engine.warmup import DeviceMemory, device_memory, measure_reserve, warmup_plan

log = structlog.get_logger("conveyor.engine")


@dataclass(frozen=True)
class RankRunner:
    runner: ModelRunner
    spec: ModelSpec  # this rank's view (its heads; the whole vocabulary)
    max_model_len: int
    num_blocks: int  # the same on every rank


def build_rank_runner(
    config: EngineConfig,
    device: torch.device,
    backend: AttentionBackend,
    group: TPGroup,
    sampler: Callable[[ModelSpec], TokenSampler] | None = None,
    collective: Callable[[], AbstractContextManager[object]] = nullcontext,
    memory: DeviceMemory | None = None,
) -> RankRunner:
    """This rank's runner. `sampler(spec)`: rank 0's sampler (ranks > 0 never sample: the runner's
    default). `collective()`: the context the block-count agreement runs in (rank 0: RankProcesses.step,
    which turns a lost rank into TensorParallelError). `memory`: the device memory the pool is sized from
    (default: CUDA's allocator on CUDA, none on the CPU)."""
    memory = memory if memory is not None else device_memory(device)
    model, spec = load_model(
        config.model,
        dtype=config.dtype,
        device=device,
        attention_backend=backend,
        model_impl=config.model_impl,
        tp=group,
        quantization=config.quantization,
    )
    max_model_len = resolve_max_model_len(config.max_model_len, spec.max_position_embeddings)

    def make_runner(pool: torch.Tensor | int, step_sampler: TokenSampler | None, graphs: bool) -> ModelRunner:
        return ModelRunner(
            model,
            spec,
            pool,
            config.block_size,
            device,
            backend,
            step_sampler,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_model_len=max_model_len,
            enable_cuda_graphs=graphs,
        )

    def warm_up(reader: DeviceMemory) -> int:  # every rank runs the same steps, so their collectives pair up
        plan = warmup_plan(
            config.max_num_batched_tokens, config.max_num_seqs, max_model_len, config.block_size
        )
        return measure_reserve(lambda n: make_runner(n, None, False), reader, plan)

    with collective():  # every rank's pool gets the smallest count that fits on all
        num_blocks = agree_num_blocks(group, rank_num_blocks(config, spec, memory, warm_up), device)
    pool = allocate_kv_pool(spec, num_blocks, config.block_size, device)
    runner = make_runner(pool, sampler(spec) if sampler is not None else None, config.enable_cuda_graphs)
    return RankRunner(runner, spec, max_model_len, num_blocks)


def resolve_max_model_len(wanted: int | None, limit: int) -> int:
    """The option, or the model's max_position_embeddings when unset; more than the model takes is refused."""
    if wanted is None:
        return limit
    if wanted > limit:
        raise ValueError(f"max_model_len={wanted} exceeds the model's max_position_embeddings={limit}")
    return wanted


def rank_num_blocks(
    config: EngineConfig,
    spec: ModelSpec,
    memory: DeviceMemory | None,
    warm_up: Callable[[DeviceMemory], int],
) -> int:
    """How many KV blocks this rank's pool gets (its own heads), before the ranks agree: num_kv_blocks as
    given, else engine/kv_sizing.py's rule. With device memory to read (CUDA) and a fractional budget,
    `warm_up(memory)` measures the step's reserve first (bytes); the free memory is read after it, once
    its cache is handed back. memory None (the CPU): the explicit budget, nothing measured."""
    if config.num_kv_blocks:
        return config.num_kv_blocks
    max_model_len = resolve_max_model_len(config.max_model_len, spec.max_position_embeddings)
    reserve = 0
    if memory is not None and measures_reserve(config.kv_cache_memory, on_device=True):
        reserve = warm_up(memory)
    budget = engine_memory(config.kv_cache_memory, memory.free() if memory is not None else None)
    per_block = bytes_per_block(spec, config.block_size)
    cap = most_blocks_usable(config.max_num_seqs, max_model_len, config.block_size)
    size = kv_pool_size(budget, reserve, per_block, cap)
    if size.blocks < 1:
        raise ValueError(
            f"KV budget of {budget} bytes less a step's reserve of {reserve} bytes is below one block "
            f"({per_block} bytes)"
        )
    log.info(
        "KV pool sized",
        blocks=size.blocks,
        fit_in_memory=size.fits,
        memory_bytes=budget,
        reserve_bytes=reserve,
        capped_at_what_the_batch_can_use=size.capped,
    )
    return size.blocks


def agree_num_blocks(group: TPGroup, num_blocks: int, device: torch.device) -> int:
    """The smallest of every rank's block count, so that one block id means the same slots everywhere."""
    if group.size == 1:
        return num_blocks
    t = torch.tensor([num_blocks], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def rank_device(device: torch.device, rank: int) -> torch.device:
    """Rank r's device: the CPU for every rank, or the r-th GPU counted from the one asked for."""
    if device.type != "cuda":
        return device
    first = device.index or 0
    if first + rank >= torch.cuda.device_count():
        raise ValueError(
            f"tensor parallel rank {rank} needs cuda:{first + rank}, but {torch.cuda.device_count()} GPUs "
            "are visible"
        )
    return torch.device("cuda", first + rank)

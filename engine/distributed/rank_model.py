"""What every rank of a tensor-parallel group builds before stepping: its model, its device and its KV
block count. Rank 0 (LLMEngine) and ranks 1..N-1 (rank_process.py) call the same functions.

Each rank loads only its shard (`load_model(..., tp=group)`): its heads, its MLP columns/rows, its slice of
the vocabulary; `ModelSpec.num_kv_heads` is then this rank's count, so its KV pool holds its own heads.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from engine.attention.backend import AttentionBackend
from engine.config import EngineConfig
from engine.distributed.group import TPGroup
from engine.kv_cache import capped_num_blocks, num_blocks_for_budget
from engine.model_loader import ModelSpec, load_model
from engine.models.generic.model import TransformersCausalLM
from engine.models.llama import LlamaForCausalLM

Model = LlamaForCausalLM | TransformersCausalLM


def load_rank_model(
    config: EngineConfig, device: torch.device, backend: AttentionBackend, group: TPGroup
) -> tuple[Model, ModelSpec]:
    """This rank's model and spec (with one rank: the whole model, as before)."""
    return load_model(
        config.model,
        dtype=config.dtype,
        device=device,
        attention_backend=backend,
        model_impl=config.model_impl,
        tp=group,
    )


def rank_num_blocks(config: EngineConfig, spec: ModelSpec, device: torch.device) -> int:
    """How many KV blocks this rank's pool gets (its own heads), before the ranks agree: num_kv_blocks as
    given, else what fits in the budget, capped at what the batch can use (`kv_cache.capped_num_blocks`)."""
    if config.num_kv_blocks:
        return config.num_kv_blocks
    fits = num_blocks_for_budget(spec, config.block_size, device, config.kv_cache_memory)
    max_model_len = config.max_model_len or spec.max_position_embeddings
    return capped_num_blocks(fits, config.max_num_seqs, max_model_len, config.block_size)


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

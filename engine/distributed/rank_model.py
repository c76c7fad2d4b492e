"""What every rank of a tensor-parallel group builds before stepping: its model and its KV block count.

`load_rank_model` is the one call that decides how a rank gets its weights. Until the sharded loader
(`load_model(..., tp=group)`) is merged, each rank loads the whole model and `VocabGathered` makes its
logits a real collective (each rank's slice of the vocabulary, gathered onto rank 0), so every step has the
cross-rank dependency, and the failure behaviour, of the sharded model: a dead or stuck rank blocks it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from engine.attention.backend import AttentionBackend
from engine.config import EngineConfig
from engine.distributed.group import TPGroup
from engine.distributed.partition import vocab_span
from engine.kv_cache import num_blocks_for_budget
from engine.model_loader import ModelSpec, load_model
from engine.models.generic.model import TransformersCausalLM
from engine.models.llama import LlamaForCausalLM

Model = LlamaForCausalLM | TransformersCausalLM


class VocabGathered:
    """A full model whose `compute_logits` keeps only this rank's vocabulary slice and gathers the slices
    onto rank 0, like a vocabulary-parallel LM head: [R, V] fp32 on rank 0, None elsewhere."""

    def __init__(self, model: Model, group: TPGroup, vocab_size: int) -> None:
        self.model, self.group = model, group
        self.span = vocab_span(vocab_size, group.rank, group.size)
        self.vocab_size = vocab_size

    @property
    def attn_backend(self) -> AttentionBackend:
        return self.model.attn_backend

    @attn_backend.setter
    def attn_backend(self, backend: AttentionBackend) -> None:
        self.model.attn_backend = backend

    def __call__(self, *args: object) -> torch.Tensor:
        return self.model(*args)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        full = self.model.compute_logits(hidden)  # [R, V] fp32
        part = full.new_zeros(full.shape[0], self.span.length)  # [R, padded_V / size]
        real = max(0, min(self.span.stop, self.vocab_size) - self.span.start)
        part[:, :real] = full[:, self.span.start : self.span.start + real]
        gathered = self.group.gather_columns(part)  # [R, padded_V] on rank 0
        return None if gathered is None else gathered[:, : self.vocab_size]


def load_rank_model(
    config: EngineConfig, device: torch.device, backend: AttentionBackend, group: TPGroup
) -> tuple[Model, ModelSpec]:
    """This rank's model and spec (with one rank: the whole model, as before)."""
    model, spec = load_model(
        config.model,
        dtype=config.dtype,
        device=device,
        attention_backend=backend,
        model_impl=config.model_impl,
    )
    if group.size == 1:
        return model, spec
    return VocabGathered(model, group, spec.vocab_size), spec  # type: ignore[return-value]


def rank_num_blocks(config: EngineConfig, spec: ModelSpec, device: torch.device) -> int:
    """How many KV blocks fit on this rank (its own heads), before the ranks agree."""
    return config.num_kv_blocks or num_blocks_for_budget(
        spec, config.block_size, device, config.kv_cache_memory
    )


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

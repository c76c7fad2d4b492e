"""What `conveyor plan` needs from a config.json the generic path runs, read without weights.

Parameters are counted on a model built on the meta device (no memory, no init), so every architecture counts
exactly: mixtures of experts (all experts), fused or tied projections, biases, extra norms. Per tensor-parallel
rank, the same meta model is split by the loader's own code (tp_shard.py), which also refuses what cannot split.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from engine.models.generic.checks import refuse_config


@dataclass(frozen=True)
class GenericShape:
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int  # per token: the dense MLP's, or top-k experts' together for a mixture of experts
    vocab_size: int
    max_position_embeddings: int
    num_params: int  # every expert counted: what the weights take in memory
    num_params_per_rank: int  # what one of tensor_parallel_size ranks holds (num_params for one)


def generic_shape(cfg: dict[str, Any], tensor_parallel_size: int = 1) -> GenericShape:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**cfg)
    refuse_config(config)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    num_params = sum(p.numel() for p in model.parameters())  # a tied head is one parameter, counted once
    per_rank = num_params
    if tensor_parallel_size != 1:
        from engine.distributed.group import TPGroup
        from engine.models.generic.tp_shard import shard_modules

        shard_modules(model, TPGroup(0, tensor_parallel_size))  # every rank holds as much as rank 0
        per_rank = sum(p.numel() for p in model.parameters())
    text = config.get_text_config()
    heads = text.num_attention_heads
    hidden = text.hidden_size
    top_k = getattr(text, "num_experts_per_tok", None)
    expert_inter = getattr(text, "moe_intermediate_size", None) or text.intermediate_size
    return GenericShape(
        num_layers=text.num_hidden_layers,
        num_heads=heads,
        num_kv_heads=getattr(text, "num_key_value_heads", None) or heads,
        head_dim=getattr(text, "head_dim", None) or hidden // heads,
        hidden_size=hidden,
        intermediate_size=expert_inter * top_k if top_k else text.intermediate_size,
        vocab_size=text.vocab_size,
        max_position_embeddings=getattr(text, "max_position_embeddings", None) or 2048,
        num_params=num_params,
        num_params_per_rank=per_rank,
    )

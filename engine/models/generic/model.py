"""A transformers causal LM behind the native models' call shape: forward(input_ids, positions, kv_caches, meta)
-> hidden [T, hidden], and compute_logits(hidden rows) -> [R, vocab] float32.

The output head is the native models' ParallelLMHead (engine/distributed/vocab_parallel.py; the loader puts it in
place of the model's own nn.Linear). Under tensor parallelism (`tp.size > 1`) both calls are collectives every
rank calls: each rank's head gives its columns of the padded vocabulary, scaled by the model's logit multipliers,
gathered onto rank 0 and trimmed to the real vocabulary; other ranks get None.

The whole step runs as one sequence [1, T] with explicit positions and use_cache=False: the model's own modules do
everything but attention, which its layers hand to `conveyor_attention` inside the step's attention scope.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from engine.attention.backend import AttentionBackend
from engine.attention.metadata import AttentionMetadata
from engine.distributed.group import TPGroup
from engine.distributed.vocab_parallel import ParallelLMHead
from engine.models.generic.attention import LayerAttention, PagedStep, attention_scope


class TransformersCausalLM(nn.Module):
    def __init__(self, hf_model: Any, layers: tuple[LayerAttention, ...], tp: TPGroup | None = None) -> None:
        super().__init__()
        self.hf = hf_model
        self.tp = tp or TPGroup.single()
        head = hf_model.get_output_embeddings()
        # The width of compute_logits' rows: the real vocabulary (a sharded head knows it; a whole one has it).
        self.vocab_size: int = getattr(head, "vocab_size", None) or head.weight.shape[0]
        self.decoder = hf_model.get_decoder()  # the base model: embeddings, layers, final norm
        self.layer_attention = layers
        # Set by the loader (or the runner), as on the native models.
        self.attn_backend: AttentionBackend | None = None

    def forward(
        self,
        input_ids: torch.Tensor,  # [T] int64
        positions: torch.Tensor,  # [T] int64
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],  # one (k, v) per layer
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [T, hidden], after the final norm
        if self.attn_backend is None:
            raise RuntimeError("model.attn_backend is not set")
        step = PagedStep(meta, kv_caches, self.attn_backend, self.layer_attention)
        with attention_scope(step):
            out = self.decoder(input_ids=input_ids[None], position_ids=positions[None], use_cache=False)
        return out[0][0]

    @property
    def lm_head(self) -> nn.Module:
        head: nn.Module = self.hf.get_output_embeddings()
        return head

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:  # [R, hidden] -> [R, vocab] fp32
        logits = head_logits(self.hf, hidden)  # [R, padded vocab / tp.size] under TP
        head = self.lm_head
        full = head.gather(logits) if isinstance(head, ParallelLMHead) else logits  # rank 0: [R, vocab]
        return None if full is None else full.float()


def head_logits(hf_model: Any, hidden: torch.Tensor) -> torch.Tensor:
    """The causal-LM head as transformers applies it after the base model: the output projection, then the
    config's logit multipliers. The loader's probe checks this against the model's own forward."""
    logits = hf_model.get_output_embeddings()(hidden)
    cfg = hf_model.config
    scale = getattr(hf_model, "logit_scale", None) or getattr(cfg, "logit_scale", None)  # Cohere: multiply
    if isinstance(scale, (int, float)) and scale != 1:
        logits = logits * scale
    divisor = getattr(cfg, "logits_scaling", None)  # Granite: divide
    if divisor not in (None, 1, 1.0):
        logits = logits / divisor
    cap = getattr(cfg, "final_logit_softcapping", None)  # Gemma 2/3
    if cap is not None:
        logits = torch.tanh(logits / cap) * cap
    return logits

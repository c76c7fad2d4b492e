"""Conveyor's attention function inside transformers' attention interface, and the per-step scope it reads.

transformers' attention modules end with `ALL_ATTENTION_FUNCTIONS[config._attn_implementation](module, q, k, v,
mask, scaling=..., sliding_window=..., softcap=..., **kwargs)`. Registering `ATTN_IMPLEMENTATION` there lets a
model's own code (norms, rotary variant, MLP or experts, multipliers) run unchanged while attention goes through
Conveyor's paged KV cache and backends. The name is not in transformers' mask interface, so the model skips mask
creation (`masking_utils._preprocess_mask_arguments` returns early) and `mask` arrives as None: masking is the
backend's job (causal, and the layer's window).

What a call needs besides its tensors (the step's metadata, the KV pool, the backend) comes from the scope the
caller entered with `attention_scope(...)`: one scope at a time, refused when nested, cleared on exit.

    step:   [1, T] tokens of every scheduled sequence, back to back (the model sees one long sequence)
    call:   query [1, H, T, D], key/value [1, KVH, T, D] (after rotary)  ->  out [1, T, H, D]
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from engine.attention.backend import AttentionBackend
from engine.attention.metadata import AttentionMetadata

ATTN_IMPLEMENTATION = "conveyor_paged"


@dataclass(frozen=True)
class LayerAttention:
    """What one layer's attention needs beyond its tensors, fixed at load."""

    scale: float
    window: int | None  # most recent positions a query sees, itself included (transformers' sliding_window)
    softcap: float | None  # logits -> softcap * tanh(logits / softcap) before the softmax


class AttentionScope(Protocol):
    def attend(
        self,
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        **kwargs: Any,
    ) -> torch.Tensor:
        """query [1, H, T, D], key/value [1, KVH, T, D] -> [1, T, H, D]."""
        ...


@dataclass
class PagedStep:
    """One engine step: writes each layer's new K/V into its cache, then attends over the paged context."""

    meta: AttentionMetadata
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]]  # per layer: [num_blocks, block_size, KVH, D] each
    backend: AttentionBackend
    layers: tuple[LayerAttention, ...]

    def attend(self, module, query, key, value, **kwargs) -> torch.Tensor:
        i = module.layer_idx
        layer = self.layers[i]
        k_cache, v_cache = self.kv_caches[i]
        # [1, heads, T, D] -> [T, heads, D]; contiguous because backends view rows by head groups.
        q = query[0].transpose(0, 1).contiguous()
        k = key[0].transpose(0, 1).contiguous()
        v = value[0].transpose(0, 1).contiguous()
        self.backend.write_kv(k, v, k_cache, v_cache, self.meta)
        extra: dict[str, Any] = {}
        # Passed only when set, so backends without windows or soft-capping still serve the plain models.
        if layer.window is not None:
            extra["window"] = layer.window
        if layer.softcap is not None:
            extra["softcap"] = layer.softcap
        out = self.backend.forward(q, k, v, k_cache, v_cache, self.meta, layer.scale, **extra)
        return out[None]  # [1, T, heads, D]


@dataclass
class ProbeCall:
    layer_idx: int | None
    num_heads: int
    num_kv_heads: int
    head_dim: int  # of the keys
    value_head_dim: int
    mask_is_none: bool
    is_causal: bool
    kwargs: dict[str, Any]


@dataclass
class Probe:
    """A load-time forward on a few tokens: records every call (layer, shapes, the module's kwargs) and answers
    with plain causal attention, so the loader can check the model and read its KV shapes."""

    calls: list[ProbeCall] = field(default_factory=list)

    def attend(self, module, query, key, value, **kwargs) -> torch.Tensor:
        mask = kwargs.pop("attention_mask", None)
        self.calls.append(
            ProbeCall(
                layer_idx=getattr(module, "layer_idx", None),
                num_heads=query.shape[1],
                num_kv_heads=key.shape[1],
                head_dim=key.shape[3],
                value_head_dim=value.shape[3],
                mask_is_none=mask is None,
                is_causal=bool(getattr(module, "is_causal", True)),
                kwargs=kwargs,
            )
        )
        scale = kwargs.get("scaling")
        out = F.scaled_dot_product_attention(
            query, key, value, is_causal=True, scale=scale, enable_gqa=query.shape[1] != key.shape[1]
        )
        return out.transpose(1, 2)


_active: list[AttentionScope] = []  # at most one: the scope entered by attention_scope()


@contextmanager
def attention_scope(scope: AttentionScope) -> Iterator[AttentionScope]:
    if _active:
        raise RuntimeError("an attention scope is already active; steps cannot nest")
    _active.append(scope)
    try:
        yield scope
    finally:
        _active.clear()


def conveyor_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The function transformers calls once per attention layer (signature of its attention interface)."""
    if not _active:
        raise RuntimeError(f"{ATTN_IMPLEMENTATION} attention called outside attention_scope()")
    return _active[0].attend(module, query, key, value, attention_mask=attention_mask, **kwargs), None


def register() -> None:
    """Make `ATTN_IMPLEMENTATION` a valid `attn_implementation` (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, conveyor_attention)

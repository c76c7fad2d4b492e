"""What the generic path refuses at load, each with the architecture and the reason.

Two stages. `refuse_config` reads only the config (no weights): encoder-decoder, vision or audio inputs,
state-space and hybrid layers, attention kinds other than full or sliding, rotary frequencies that depend on the
batch. `refuse_probe` reads what a probe forward on a few tokens recorded: every layer must call the attention
interface exactly once, causally, with no mask of its own and nothing the backends do not implement (sinks).
"""

from __future__ import annotations

from typing import Any

from engine.models.config import UnsupportedModelError
from engine.models.generic.attention import ProbeCall

ATTENTION_LAYER_TYPES = ("full_attention", "sliding_attention")
# Config fields that only state-space layers have (Mamba, Mamba2, Jamba, Falcon-H1, Bamba, Zamba, Nemotron-H...).
_STATE_FIELDS = ("ssm_state_size", "state_size", "mamba_d_state", "mamba_expand")
_MEDIA_FIELDS = ("vision_config", "audio_config", "speech_config", "vision_tower", "image_token_index")
# Module kwargs whose meaning the backends do not implement: attention sinks change the softmax's denominator.
_UNSUPPORTED_KWARGS = {"s_aux": "attention sinks", "sinks": "attention sinks"}


def architecture(config: Any) -> str:
    archs = getattr(config, "architectures", None) or []
    return archs[0] if archs else f"model_type {getattr(config, 'model_type', '?')!r}"


def refuse(config: Any, reason: str) -> UnsupportedModelError:
    return UnsupportedModelError(f"{architecture(config)}: {reason}")


def refuse_config(config: Any) -> None:
    """Raise UnsupportedModelError if the generic path cannot run this config exactly."""
    if getattr(config, "is_encoder_decoder", False):
        raise refuse(config, "encoder-decoder models are not supported (only decoder-only causal LMs)")
    media = [f for f in _MEDIA_FIELDS if getattr(config, f, None) is not None]
    if media or config.get_text_config() is not config:
        raise refuse(
            config, f"takes vision or audio inputs ({', '.join(media) or 'a sub-config'}); text-only"
        )
    state = [f for f in _STATE_FIELDS if getattr(config, f, None) is not None]
    types = list(getattr(config, "layer_types", None) or [])
    other = sorted(set(types) - set(ATTENTION_LAYER_TYPES))
    if state or any("linear" in t or "hybrid" in t or "mamba" in t for t in other):
        raise refuse(config, f"state-space or hybrid layers ({', '.join(state + other)}) are not supported")
    if other:
        raise refuse(
            config, f"layer types {other} are not supported; only {', '.join(ATTENTION_LAYER_TYPES)}"
        )
    if getattr(config, "use_bidirectional_attention", False):
        raise refuse(config, "bidirectional attention is not supported; only causal")
    for kind in _rope_types(config):
        # transformers' dynamic_rope_update recomputes these frequencies from the longest position in the
        # forward's batch: with unrelated sequences in one step, a sequence's rotary would depend on the others.
        if "dynamic" in kind or kind == "longrope":
            raise refuse(config, f"rope type {kind!r} is not supported (its frequencies depend on the batch)")


def _rope_types(config: Any) -> set[str]:
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    # Per-layer-type parameters ({"full_attention": {...}, "sliding_attention": {...}}) or one dict.
    groups = [v for v in params.values() if isinstance(v, dict)] or [params]
    return {g.get("rope_type") or g.get("type") or "default" for g in groups}


def refuse_probe(config: Any, calls: list[ProbeCall], num_layers: int) -> None:
    """Checks on the attention calls one probe forward made."""
    seen = [c.layer_idx for c in calls]
    if sorted(i for i in seen if i is not None) != list(range(num_layers)) or None in seen:
        raise refuse(
            config,
            f"its attention bypasses transformers' attention interface (called for layers {seen}, expected "
            f"each of 0..{num_layers - 1} once): state-space, hybrid or custom attention code",
        )
    for c in calls:
        if c.value_head_dim != c.head_dim:  # e.g. multi-head latent attention
            raise refuse(
                config,
                f"layer {c.layer_idx}: key and value head sizes differ ({c.head_dim}, "
                f"{c.value_head_dim}); the KV cache holds one head size",
            )
        if not c.is_causal:
            raise refuse(config, f"layer {c.layer_idx} attention is not causal")
        if not c.mask_is_none:
            raise refuse(
                config, f"layer {c.layer_idx} builds its own attention mask, which the engine ignores"
            )
        for name, what in _UNSUPPORTED_KWARGS.items():
            if c.kwargs.get(name) is not None:
                raise refuse(config, f"layer {c.layer_idx} uses {what}, which the engine does not implement")
    shapes = {(c.num_heads, c.num_kv_heads, c.head_dim) for c in calls}
    if len(shapes) != 1:
        raise refuse(
            config, f"layers differ in attention shape (heads, kv heads, head dim): {sorted(shapes)}"
        )


def is_mixture_of_experts(config: Any) -> bool:
    """More than one expert per MoE layer (Mixtral's num_local_experts, Qwen-MoE's num_experts, DeepSeek's
    n_routed_experts)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    names = ("num_local_experts", "num_experts", "n_routed_experts")
    return any((getattr(text, n, None) or 0) > 1 for n in names)


def refuse_cuda_graphs(config: Any) -> None:
    """CUDA graphs replay a fixed sequence of kernels; transformers' expert routing reads the router's choice
    back to the host (nonzero(), tolist()), which a capturing stream forbids."""
    if is_mixture_of_experts(config):
        raise refuse(
            config,
            "enable_cuda_graphs is not supported for mixture-of-experts models on the transformers path "
            "(their expert routing reads the routing back to the host, which graph capture forbids); "
            "run without enable_cuda_graphs",
        )

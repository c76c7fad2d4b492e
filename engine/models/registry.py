"""Which HF architectures we run, and how their weight names map onto our modules."""

from __future__ import annotations

import re

from engine.models.config import ARCHITECTURES, MODEL_TYPES, ModelArgs, UnsupportedModelError, supported_names
from engine.models.llama import LlamaForCausalLM

__all__ = [
    "ARCHITECTURES",
    "UnsupportedModelError",
    "build_model",
    "is_native",
    "map_weight_name",
    "supported_names",
]

# HF projection -> (our fused parameter, shard name). Shards are laid out in the order listed per target.
_FUSED = {
    "q_proj": ("qkv_proj", "q"),
    "k_proj": ("qkv_proj", "k"),
    "v_proj": ("qkv_proj", "v"),
    "gate_proj": ("gate_up_proj", "gate"),
    "up_proj": ("gate_up_proj", "up"),
}
_SKIP = re.compile(r"rotary_emb\.inv_freq$")


def build_model(args: ModelArgs) -> LlamaForCausalLM:
    # Every supported family shares one implementation; the switches live in ModelArgs.
    if args.family not in {"llama", "mistral", "qwen2", "qwen3"}:
        raise UnsupportedModelError(f"unsupported family {args.family!r}; supported: {supported_names()}")
    return LlamaForCausalLM(args)


def is_native(cfg: dict) -> bool:
    """Whether `model_impl="auto"` runs this config.json on our own model code (else on transformers' code)."""
    archs = cfg.get("architectures") or []
    if archs:
        return any(a in ARCHITECTURES for a in archs)
    return cfg.get("model_type") in MODEL_TYPES


def map_weight_name(hf_name: str) -> tuple[str, str | None] | None:
    """HF checkpoint name -> (our parameter name, shard or None); None for tensors we do not use."""
    if _SKIP.search(hf_name):
        return None
    name = hf_name.removeprefix("model.")
    parts = name.split(".")
    if len(parts) >= 2 and parts[-2] in _FUSED:
        fused, shard = _FUSED[parts[-2]]
        return ".".join([*parts[:-2], fused, parts[-1]]), shard
    return name, None

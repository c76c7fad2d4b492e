"""The one list of HF architectures we run, and how their weight names map onto our modules.

Imports no torch, so the CLI (`make-tiny-model --arch`, `demo --arch`), `conveyor plan`, the tiny-model
maker and the loader all read the same table cheaply.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.distributed.group import TPGroup
    from engine.models.config import ModelArgs
    from engine.models.llama import LlamaForCausalLM

# HF `architectures` entry -> our family name; the family decides bias and q/k-norm switches.
ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
# Our family names, which are also the HF `model_type` of each.
FAMILIES: tuple[str, ...] = tuple(dict.fromkeys(ARCHITECTURES.values()))
# Families that `model_impl="auto"` runs on the generic path (engine/models/generic/: their own transformers
# modules on our paged attention), each with a tiny model. The generic path takes any decoder-only LM; these are
# the ones tested token for token.
GENERIC_FAMILIES: tuple[str, ...] = ("gemma2", "gemma3", "phi3", "olmo2", "mixtral", "qwen3_moe", "gpt_neox")
# What `make-tiny-model --arch`, `demo --arch` and `tiny:<arch>` accept.
TINY_ARCHS: tuple[str, ...] = FAMILIES + GENERIC_FAMILIES


class UnsupportedModelError(ValueError):
    pass


def supported_names() -> str:
    return ", ".join(sorted(ARCHITECTURES)) + " (model_type " + ", ".join(sorted(FAMILIES)) + ")"


def is_native(cfg: dict[str, Any]) -> bool:
    """Whether `model_impl="auto"` runs this config.json on our own model code (else on transformers' code)."""
    try:
        family_of(cfg)
    except UnsupportedModelError:
        return False
    return True


def family_of(cfg: dict[str, Any]) -> str:
    """The family of a HF config.json: from `architectures`, else (when that is absent) `model_type`."""
    for arch in cfg.get("architectures") or []:
        if arch in ARCHITECTURES:
            return ARCHITECTURES[arch]
    if not cfg.get("architectures") and cfg.get("model_type") in FAMILIES:
        return str(cfg["model_type"])
    named = cfg.get("architectures") or cfg.get("model_type")
    raise UnsupportedModelError(f"unsupported model {named!r}; supported: {supported_names()}")


# HF projection -> (our fused parameter, shard name). Shards are laid out in the order listed per target.
_FUSED = {
    "q_proj": ("qkv_proj", "q"),
    "k_proj": ("qkv_proj", "k"),
    "v_proj": ("qkv_proj", "v"),
    "gate_proj": ("gate_up_proj", "gate"),
    "up_proj": ("gate_up_proj", "up"),
}
_SKIP = re.compile(r"rotary_emb\.inv_freq$")


def build_model(args: ModelArgs, tp: TPGroup | None = None) -> LlamaForCausalLM:
    """This rank's part of the model (`tp` None: the whole model on one device)."""
    # Every supported family shares one implementation; the switches live in ModelArgs.
    from engine.models.llama import LlamaForCausalLM

    if args.family not in FAMILIES:
        raise UnsupportedModelError(f"unsupported family {args.family!r}; supported: {supported_names()}")
    return LlamaForCausalLM(args, tp=tp)


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

"""Our own view of a HF `config.json`: the few numbers the model code needs, parsed once, no transformers."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.models.registry import UnsupportedModelError, family_of

__all__ = ["ModelArgs", "UnsupportedModelError", "rope_inv_freq"]

ROPE_TYPES = ("default", "linear", "llama3")
LAYER_TYPES = ("full_attention", "sliding_attention")
# transformers' config defaults where the key is absent from config.json (MistralConfig, Qwen2/3Config).
DEFAULT_SLIDING_WINDOW = 4096
DEFAULT_MAX_WINDOW_LAYERS = 28


@dataclass(frozen=True)
class ModelArgs:
    family: str  # one of engine.models.registry.FAMILIES
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    qk_norm: bool
    rope_theta: float
    # Normalised rope settings: {"rope_type": ..., plus that type's keys}; rope_theta lives above.
    rope: dict[str, Any] = field(default_factory=dict)
    torch_dtype: torch.dtype | None = None
    eos_token_ids: tuple[int, ...] = ()
    # Per layer: the sliding window (keys i - window < j <= i), or None for full causal attention.
    # Empty: every layer full (ModelArgs built by hand).
    layer_windows: tuple[int | None, ...] = ()

    def window(self, layer: int) -> int | None:
        return self.layer_windows[layer] if self.layer_windows else None

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> ModelArgs:
        family = family_of(cfg)
        hidden = cfg["hidden_size"]
        heads = cfg["num_attention_heads"]
        if cfg.get("hidden_act", "silu") != "silu":
            raise UnsupportedModelError(f"hidden_act {cfg.get('hidden_act')!r} unsupported; only 'silu'")
        theta, rope = _rope(cfg)
        return cls(
            family=family,
            vocab_size=cfg["vocab_size"],
            hidden_size=hidden,
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or hidden // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            # Qwen2 always has q/k/v bias; Llama/Qwen3 only when `attention_bias` says so.
            qkv_bias=family == "qwen2" or bool(cfg.get("attention_bias", False)),
            qk_norm=family == "qwen3",
            rope_theta=theta,
            rope=rope,
            torch_dtype=config_dtype(cfg.get("torch_dtype") or cfg.get("dtype")),
            eos_token_ids=config_ids(cfg.get("eos_token_id")),
            layer_windows=layer_windows(cfg, family),
        )


def layer_windows(cfg: dict[str, Any], family: str) -> tuple[int | None, ...]:
    """Each layer's sliding window, read the way transformers' own class for the family reads it:
    - llama: LlamaForCausalLM has no windows; a `sliding_window` key is ignored there, so here too.
    - mistral: `sliding_window` (4096 when absent; null = off) on every layer; MistralForCausalLM ignores
      `layer_types`.
    - qwen2, qwen3: only with `use_sliding_window`; then the layers `layer_types` marks
      "sliding_attention", or when absent those with index >= `max_window_layers`.
    Layer types the native model cannot run (chunked, linear attention...) are refused."""
    layers = cfg["num_hidden_layers"]
    if family == "llama":
        return (None,) * layers
    window = cfg.get("sliding_window", DEFAULT_SLIDING_WINDOW)
    if family in ("qwen2", "qwen3") and not cfg.get("use_sliding_window", False):
        window = None
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise UnsupportedModelError(f"sliding_window must be a positive int or null, got {window!r}")
    if family == "mistral":
        return (window,) * layers
    types = cfg.get("layer_types")
    if types is None:
        first = cfg.get("max_window_layers", DEFAULT_MAX_WINDOW_LAYERS)
        types = ["sliding_attention" if i >= first else "full_attention" for i in range(layers)]
    if len(types) != layers:
        raise UnsupportedModelError(f"layer_types has {len(types)} entries for {layers} layers")
    unknown = sorted(set(types) - set(LAYER_TYPES))
    if unknown:
        raise UnsupportedModelError(
            f"layer_types {unknown} unsupported by the native {family} model; supported: {', '.join(LAYER_TYPES)}"
        )
    return tuple(window if t == "sliding_attention" else None for t in types)


def _rope(cfg: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """Read transformers-5 `rope_parameters` or the older `rope_theta` + `rope_scaling`."""
    params = dict(cfg.get("rope_parameters") or {})
    # Some configs nest parameters per attention type ({"full_attention": {...}}).
    if "full_attention" in params and isinstance(params["full_attention"], dict):
        params = dict(params["full_attention"])
    scaling = dict(cfg.get("rope_scaling") or {})
    merged = {**scaling, **params}
    theta = float(merged.pop("rope_theta", None) or cfg.get("rope_theta") or 10000.0)
    kind = merged.pop("rope_type", None) or merged.pop("type", None) or "default"
    merged.pop("type", None)
    if kind not in ROPE_TYPES:
        raise UnsupportedModelError(f"rope type {kind!r} unsupported; supported: {', '.join(ROPE_TYPES)}")
    return theta, {"rope_type": kind, **merged}


def config_dtype(name: Any) -> torch.dtype | None:
    """config.json's `torch_dtype` / `dtype` ("bfloat16", "torch.float16") as a torch dtype; None if absent."""
    if not isinstance(name, str):
        return None
    return getattr(torch, name.removeprefix("torch."), None)


def config_ids(value: Any) -> tuple[int, ...]:
    """config.json's `eos_token_id` (an int, a list or null) as a tuple."""
    if value is None:
        return ()
    return tuple(value) if isinstance(value, list) else (int(value),)


def rope_inv_freq(args: ModelArgs) -> torch.Tensor:
    """[head_dim // 2] float32 on the CPU (even under a meta-device context), same formulas as transformers."""
    dim = args.head_dim
    inv = 1.0 / (args.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim))
    kind = args.rope["rope_type"]
    if kind == "linear":
        return inv / args.rope["factor"]
    if kind == "llama3":
        return _llama3(inv, args.rope)
    return inv


def _llama3(inv: torch.Tensor, r: dict[str, Any]) -> torch.Tensor:
    # Long wavelengths are divided by `factor`, short ones kept, the band between smoothly interpolated.
    factor, low, high = r["factor"], r["low_freq_factor"], r["high_freq_factor"]
    old_len = r["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)

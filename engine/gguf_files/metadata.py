"""A GGUF file's metadata as a HF config dict: the fields config.json would hold, so the loaders that read
config.json (ModelArgs.from_hf for the native models, transformers' config classes for the generic path) read
a GGUF file the same way.

llama.cpp's keys are `<arch>.<key>` with `<arch>` = `general.architecture`. Mistral files carry the
architecture "llama" (llama.cpp runs them as Llama, with full attention); so do we.
"""

from __future__ import annotations

from typing import Any

from engine.models.registry import UnsupportedModelError

# general.architecture -> (HF `architectures` entry, HF model_type). Llama, Qwen2 and Qwen3 run on our native
# code; Gemma 2 and 3 on the generic path (their own transformers modules on our paged attention).
ARCHITECTURES: dict[str, tuple[str, str]] = {
    "llama": ("LlamaForCausalLM", "llama"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
    "gemma2": ("Gemma2ForCausalLM", "gemma2"),
    "gemma3": ("Gemma3ForCausalLM", "gemma3_text"),
}
GEMMA = ("gemma2", "gemma3")
# Gemma 2 27B scales queries by hidden / heads, not by head_dim (llama.cpp tells it by its 46 layers).
GEMMA2_27B_LAYERS = 46


class Fields:
    """Reads of a GGUF file's metadata (reader.py's `fields`); `arch(key)` reads `<general.architecture>.<key>`."""

    def __init__(self, fields: dict[str, Any]) -> None:
        self.fields = fields
        self.architecture = str(self.get("general.architecture"))

    def has(self, key: str) -> bool:
        return key in self.fields

    def get(self, key: str, default: Any = None) -> Any:
        value = self.fields.get(key)
        return default if value is None else value

    def arch(self, key: str, default: Any = None) -> Any:
        return self.get(f"{self.architecture}.{key}", default)

    def need(self, key: str) -> Any:
        value = self.arch(key)
        if value is None:
            raise UnsupportedModelError(f"GGUF metadata lacks {self.architecture}.{key}")
        return value


def architecture_of(fields: Fields) -> tuple[str, str]:
    """(HF architecture, model_type) of the file, or one line refusing it."""
    if fields.architecture not in ARCHITECTURES:
        raise UnsupportedModelError(
            f"GGUF architecture {fields.architecture!r} unsupported; supported: {', '.join(ARCHITECTURES)}"
        )
    return ARCHITECTURES[fields.architecture]


def hf_config(fields: Fields, tensor_names: set[str], vocab_size: int) -> dict[str, Any]:
    """config.json's fields for the file. `tensor_names`: the file's (llama.cpp) tensor names, which say
    whether the head is tied and whether q/k/v have biases; `vocab_size`: rows of token_embd."""
    hf_arch, model_type = architecture_of(fields)
    hidden = int(fields.need("embedding_length"))
    heads = int(fields.need("attention.head_count"))
    head_dim = int(fields.arch("attention.key_length") or hidden // heads)
    rotary = fields.arch("rope.dimension_count")
    if rotary is not None and int(rotary) != head_dim and fields.architecture not in GEMMA:
        raise UnsupportedModelError(
            f"GGUF rotary over {rotary} of {head_dim} head dims (partial) unsupported"
        )
    if "rope_freqs.weight" in tensor_names:
        raise UnsupportedModelError("GGUF rope_freqs.weight (Llama 3.1-style rope scaling) unsupported")
    cfg: dict[str, Any] = {
        "architectures": [hf_arch],
        "model_type": model_type,
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "intermediate_size": int(fields.need("feed_forward_length")),
        "num_hidden_layers": int(fields.need("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(fields.arch("attention.head_count_kv") or heads),
        "head_dim": head_dim,
        "rms_norm_eps": float(fields.arch("attention.layer_norm_rms_epsilon", 1e-6)),
        "max_position_embeddings": int(fields.arch("context_length", 2048)),
        "rope_theta": float(fields.arch("rope.freq_base", 10000.0)),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "attention_bias": "blk.0.attn_q.bias" in tensor_names,
        "hidden_act": "silu",
        **special_ids(fields),
    }
    scaling = rope_scaling(fields)
    if scaling is not None:
        cfg["rope_scaling"] = scaling
    if fields.architecture in GEMMA:
        cfg.update(_gemma(fields, cfg))
    return cfg


def rope_scaling(fields: Fields) -> dict[str, Any] | None:
    kind = fields.arch("rope.scaling.type")
    if kind in (None, "none"):
        return None
    if kind != "linear":
        raise UnsupportedModelError(f"GGUF rope scaling {kind!r} unsupported; supported: linear")
    return {"rope_type": "linear", "factor": float(fields.arch("rope.scaling.factor"))}


def special_ids(fields: Fields) -> dict[str, Any]:
    """bos, eos and pad ids; eos also the end-of-turn and end-of-message ids a chat model stops on."""
    eos = [
        int(fields.get(f"tokenizer.ggml.{key}"))
        for key in ("eos_token_id", "eot_token_id", "eom_token_id")
        if fields.has(f"tokenizer.ggml.{key}")
    ]
    ids: dict[str, Any] = {"eos_token_id": list(dict.fromkeys(eos)) or None}
    for key in ("bos_token_id", "pad_token_id"):
        if fields.has(f"tokenizer.ggml.{key}"):
            ids[key] = int(fields.get(f"tokenizer.ggml.{key}"))
    return ids


def _gemma(fields: Fields, cfg: dict[str, Any]) -> dict[str, Any]:
    """Gemma's extra settings: window, soft caps, query scale, activation (gelu-tanh)."""
    out: dict[str, Any] = {"hidden_activation": "gelu_pytorch_tanh", "hidden_act": "gelu_pytorch_tanh"}
    del cfg["attention_bias"]
    window = fields.arch("attention.sliding_window")
    if window is not None:
        out["sliding_window"] = int(window)
    if fields.architecture == "gemma2":
        out["attn_logit_softcapping"] = fields.arch("attn_logit_softcapping")
        out["final_logit_softcapping"] = fields.arch("final_logit_softcapping")
        wide = cfg["num_hidden_layers"] == GEMMA2_27B_LAYERS
        out["query_pre_attn_scalar"] = (
            cfg["hidden_size"] // cfg["num_attention_heads"] if wide else cfg["head_dim"]
        )
    else:
        out["query_pre_attn_scalar"] = cfg["head_dim"]
    return out

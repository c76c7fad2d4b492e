"""Write a HF checkpoint folder (a tiny model from engine/tiny_model.py) as a GGUF file, the way llama.cpp's
convert_hf_to_gguf.py lays it out: its tensor names, Q/K rows permuted for the "llama" architecture, Gemma's
norms stored as w + 1, the tokenizer (byte-level BPE) and chat template in the metadata.

Written independently of engine/gguf_files/ (its own name table and permutation), so a test that writes
with this and loads with the engine checks the engine's mapping rather than repeating it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

# HF model_type -> llama.cpp architecture
GGUF_ARCH = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma2": "gemma2",
             "gemma3_text": "gemma3"}  # fmt: skip
_LAYER = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_LLAMA = {**_LAYER, "post_attention_layernorm": "ffn_norm"}
_GEMMA = {
    **_LAYER,
    "pre_feedforward_layernorm": "ffn_norm",
    "post_attention_layernorm": "post_attention_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}


def gguf_name(hf: str, gemma: bool) -> str:
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    parts = hf.split(".")  # model.layers.N.<module path>.weight
    module, kind = ".".join(parts[3:-1]), parts[-1]
    return f"blk.{parts[2]}.{(_GEMMA if gemma else _LLAMA)[module]}.{kind}"


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: each head's halves interleaved into pairs."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(model_dir: Path, out: Path, qtype_name: str = "F32") -> Path:
    """`qtype_name`: the type of the 2-D weights (F32, F16, Q8_0 ...); 1-D tensors stay F32, as llama.cpp
    keeps norms."""
    import gguf
    from gguf.quants import quantize

    cfg = json.loads((model_dir / "config.json").read_text())
    arch = GGUF_ARCH[cfg["model_type"]]
    gemma = arch.startswith("gemma")
    writer = gguf.GGUFWriter(str(out), arch)
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(cfg["num_attention_heads"])
    writer.add_head_count_kv(cfg["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    rope = cfg.get("rope_parameters") or {}
    theta = (
        rope.get("rope_theta") or cfg.get("rope_theta") or rope.get("full_attention", {}).get("rope_theta")
    )
    writer.add_rope_freq_base(float(theta))
    writer.add_key_length(cfg["head_dim"])
    writer.add_value_length(cfg["head_dim"])
    writer.add_rope_dimension_count(cfg["head_dim"])
    if gemma and cfg.get("sliding_window"):
        writer.add_sliding_window(cfg["sliding_window"])
    if arch == "gemma2":
        writer.add_attn_logit_softcapping(cfg["attn_logit_softcapping"])
        writer.add_final_logit_softcapping(cfg["final_logit_softcapping"])
    _write_tokenizer(writer, model_dir, cfg)
    qtype = gguf.GGMLQuantizationType[qtype_name]
    for hf, w in load_file(str(model_dir / "model.safetensors")).items():
        if hf == "lm_head.weight" and cfg.get("tie_word_embeddings"):
            continue
        w = w.astype(np.float32)
        if arch == "llama" and hf.endswith(("q_proj.weight", "k_proj.weight")):
            heads = cfg["num_attention_heads"] if "q_proj" in hf else cfg["num_key_value_heads"]
            w = permute(w, heads)
        if gemma and hf.endswith("norm.weight"):
            w = w + 1
        if w.ndim == 1 or qtype == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(gguf_name(hf, gemma), w)
        elif qtype == gguf.GGMLQuantizationType.F16:
            writer.add_tensor(gguf_name(hf, gemma), w.astype(np.float16))
        else:
            writer.add_tensor(gguf_name(hf, gemma), quantize(w, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def _write_tokenizer(writer, model_dir: Path, cfg: dict) -> None:
    tok = json.loads((model_dir / "tokenizer.json").read_text())
    vocab = dict(tok["model"]["vocab"])
    special = {t["content"]: t["id"] for t in tok["added_tokens"]}
    vocab.update(special)
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in special else 1 for t in tokens])  # 3: control, 1: normal
    writer.add_token_merges(merges)
    writer.add_bos_token_id(cfg["bos_token_id"])
    writer.add_eos_token_id(cfg["eos_token_id"])
    writer.add_pad_token_id(cfg["pad_token_id"])
    writer.add_add_bos_token(True)
    template = json.loads((model_dir / "tokenizer_config.json").read_text()).get("chat_template")
    if template is None and (model_dir / "chat_template.jinja").exists():
        template = (model_dir / "chat_template.jinja").read_text()
    if template:
        writer.add_chat_template(template)

"""llama.cpp's tensor names -> HF's, and the row order llama.cpp gives Q and K for its rotary layout.

    token_embd.weight          -> model.embed_tokens.weight
    blk.7.attn_q.weight        -> model.layers.7.self_attn.q_proj.weight
    output.weight              -> lm_head.weight          (absent when tied to token_embd)

Row order: llama.cpp's Llama graph rotates adjacent pairs (x0, x1), (x2, x3) ... while HF's rotates the two
halves of each head (x_i, x_{i + D/2}). Its converter (convert_hf_to_gguf.py, LlamaModel.permute) therefore
reorders each head's rows of q_proj and k_proj: GGUF row h*D + 2i + j holds HF row h*D + j*D/2 + i
(i < D/2, j in {0, 1}). `hf_row_order` undoes it. Only the "llama" architecture is permuted: Qwen and Gemma
files use the halves layout (llama.cpp's NEOX rope) as HF does.
"""

from __future__ import annotations

import re

import numpy as np

# Per-layer tensors: llama.cpp name -> HF name under model.layers.N (weight or bias appended).
_LAYER = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# Llama, Qwen: ffn_norm is the norm before the MLP. Gemma 2/3 ("sandwich" norms): ffn_norm is still the one
# before the MLP, and two more follow attention and the MLP.
_LLAMA_LAYER = {**_LAYER, "ffn_norm": "post_attention_layernorm"}
_GEMMA_LAYER = {
    **_LAYER,
    "ffn_norm": "pre_feedforward_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_GLOBAL = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)$")
_TOP = re.compile(r"(\w+)\.(weight|bias)$")
# The architectures whose converter permuted Q/K rows (LlamaModel and its subclasses).
PERMUTED_ARCHS = ("llama",)


def hf_name(gguf_name: str, architecture: str) -> str | None:
    """The HF name of a llama.cpp tensor; None for one we do not know (the loader names it and stops)."""
    layer_names = _GEMMA_LAYER if architecture.startswith("gemma") else _LLAMA_LAYER
    block = _BLOCK.match(gguf_name)
    if block:
        index, part, kind = block.groups()
        hf = layer_names.get(part)
        return None if hf is None else f"model.layers.{index}.{hf}.{kind}"
    top = _TOP.match(gguf_name)
    if top and top.group(1) in _GLOBAL:
        return f"{_GLOBAL[top.group(1)]}.{top.group(2)}"
    return None


def permuted_heads(hf: str, architecture: str, heads: int, kv_heads: int) -> int | None:
    """How many heads' rows llama.cpp permuted in this tensor (None: stored in HF order)."""
    if architecture not in PERMUTED_ARCHS or not hf.endswith(".weight"):
        return None
    if hf.endswith("self_attn.q_proj.weight"):
        return heads
    if hf.endswith("self_attn.k_proj.weight"):
        return kv_heads
    return None


def hf_row_order(rows: int, heads: int) -> np.ndarray:
    """[rows] int64: the GGUF row that holds each HF row of a permuted q_proj / k_proj."""
    half = rows // heads // 2
    gguf_rows = np.arange(rows).reshape(heads, half, 2)  # GGUF row h*D + 2i + j at [h, i, j]
    return np.ascontiguousarray(gguf_rows.transpose(0, 2, 1)).reshape(rows)  # HF order: [h, j, i]


def is_gemma_norm(hf: str, architecture: str) -> bool:
    """Gemma's RMSNorm multiplies by (1 + w); llama.cpp's converter stores w + 1 (so llama.cpp multiplies by
    the stored value): the loader subtracts 1 again."""
    return architecture.startswith("gemma") and hf.endswith("norm.weight")

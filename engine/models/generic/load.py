"""Load any decoder-only causal LM through transformers onto Conveyor's paged attention, or refuse it.

    config checks (no weights)  ->  from_pretrained(attn_implementation="conveyor_paged")  ->  probe forward
    ->  per-layer scale / window / soft-cap  ->  TransformersCausalLM + ModelSpec

Under tensor parallelism (`tp` of several ranks) the model is instead built on the meta device and each rank
reads only its slices of the checkpoint (tp_load.py, tp_shard.py); the probe then runs on every rank (its
forward is collective) and checks the attention calls see this rank's share of the heads.

The probe runs a few tokens through the model twice under a recording scope: once through its own causal-LM
forward, once as base model + `head_logits`. The first checks every layer called the attention interface once
(and reads the KV shapes from the calls); comparing the two checks the head holds no step we do not repeat.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from engine.distributed.group import TPGroup
from engine.distributed.partition import kv_heads_per_rank
from engine.models.config import UnsupportedModelError
from engine.models.generic.attention import (
    ATTN_IMPLEMENTATION,
    LayerAttention,
    Probe,
    ProbeCall,
    attention_scope,
    register,
)
from engine.models.generic.checks import refuse, refuse_config, refuse_probe
from engine.models.generic.model import TransformersCausalLM, head_logits

if TYPE_CHECKING:
    from engine.gguf_files.checkpoint import GGUFCheckpoint

PROBE_TOKENS = 6


def read_config(source: Path | GGUFCheckpoint) -> Any:
    """The folder's config.json, or a GGUF file's metadata read as one (engine/gguf_files/metadata.py)."""
    from transformers import AutoConfig

    try:
        if isinstance(source, Path):
            return AutoConfig.from_pretrained(str(source))
        fields = dict(source.config)
        return AutoConfig.for_model(fields.pop("model_type"), **fields)
    except (ValueError, KeyError) as e:  # a model_type this transformers does not know
        raise UnsupportedModelError(f"{source}: transformers cannot read this config ({e})") from e


def causal_lm_class(config: Any) -> Any:
    from transformers import AutoModelForCausalLM

    try:
        cls: Any = AutoModelForCausalLM._model_mapping[type(config)]
    except KeyError as e:
        raise refuse(config, "transformers has no causal-LM class for it (not a decoder-only LM)") from e
    if not getattr(cls, "_supports_attention_backend", False):
        raise refuse(
            config,
            f"{cls.__name__} computes attention in its own code, bypassing transformers' attention "
            "interface (_supports_attention_backend is False)",
        )
    return cls


def load_transformers_model(
    source: Path | GGUFCheckpoint, torch_dtype: torch.dtype, device: torch.device, tp: TPGroup | None = None
) -> tuple[TransformersCausalLM, ProbeCall]:
    """Returns the wrapped model in eval mode (attn_backend not set) and one probe call (the KV shapes; under
    tensor parallelism this rank's heads and KV heads, which size its KV pool). `source`: a checkpoint
    folder, or an open GGUF file (read, like a sharded load, through its lazy tensor views)."""
    tp = tp or TPGroup.single()
    config = read_config(source)
    refuse_config(config)
    cls = causal_lm_class(config)
    register()
    if tp.size > 1 or not isinstance(source, Path):
        from engine.models.generic.tp_load import load_shard
        from engine.models.generic.tp_shard import check_splits

        check_splits(config, tp.size)  # before any weight is read
        hf = load_shard(source, cls, config, torch_dtype, device, tp)
    else:
        from engine.models.generic.tp_shard import whole_head

        hf = _from_pretrained(source, cls, torch_dtype).to(device).eval()
        whole_head(hf)  # the same head type on every path: one F.linear, or sliced on the CPU
    calls = probe(hf)
    if tp.size > 1:
        _check_rank_heads(hf.config, calls[0], tp)
    text = hf.config.get_text_config()
    layers = tuple(
        layer_attention(text, i, c) for i, c in enumerate(sorted(calls, key=lambda c: c.layer_idx or 0))
    )
    return TransformersCausalLM(hf, layers, tp), calls[0]


def _from_pretrained(model_dir: Path, cls: Any, torch_dtype: torch.dtype) -> Any:
    hf, info = cls.from_pretrained(
        str(model_dir), dtype=torch_dtype, attn_implementation=ATTN_IMPLEMENTATION, output_loading_info=True
    )
    # transformers fills missing weights with random ones and only logs it: never serve those.
    problems = {k: sorted(v) for k, v in info.items() if k != "error_msgs" and v}
    if problems or info.get("error_msgs"):
        detail = "; ".join(f"{k}: {', '.join(map(str, v[:4]))}" for k, v in problems.items())
        raise KeyError(f"{model_dir}: checkpoint does not match {cls.__name__} ({detail})")
    return hf


def _check_rank_heads(config: Any, call: ProbeCall, tp: TPGroup) -> None:
    """The attention calls must see this rank's share of the heads: a model whose code takes head counts from
    its config rather than from the projections' widths would attend over the wrong heads."""
    text = config.get_text_config()
    heads = text.num_attention_heads
    want = (heads // tp.size, kv_heads_per_rank(getattr(text, "num_key_value_heads", None) or heads, tp.size))
    if (call.num_heads, call.num_kv_heads) != want:
        raise refuse(
            config,
            f"under tensor parallelism its attention sees (heads, kv heads) = ({call.num_heads}, "
            f"{call.num_kv_heads}), not this rank's {want}: its code does not follow the split projections",
        )


def probe(hf: Any) -> list[ProbeCall]:
    config = hf.config
    device = next(hf.parameters()).device
    vocab = hf.get_output_embeddings().weight.shape[0]
    ids = (torch.arange(PROBE_TOKENS, device=device) * 7 + 3)[None] % vocab  # [1, P]
    pos = torch.arange(PROBE_TOKENS, device=device)[None]
    full, split = Probe(), Probe()
    with torch.inference_mode():
        with attention_scope(full):
            reference = hf(input_ids=ids, position_ids=pos, use_cache=False).logits[0].float()
        with attention_scope(split):
            hidden = hf.get_decoder()(input_ids=ids, position_ids=pos, use_cache=False)[0][0]
            ours = head_logits(hf, hidden).float()
    refuse_probe(config, full.calls, config.get_text_config().num_hidden_layers)
    tol = 1e-3 * max(1.0, float(reference.abs().max()))
    if reference.shape != ours.shape or not torch.allclose(reference, ours, rtol=1e-3, atol=tol):
        raise refuse(
            config,
            f"{type(hf).__name__}'s forward does more after the base model than its output projection and "
            "the config's logit multipliers (logit_scale, logits_scaling, final_logit_softcapping)",
        )
    return full.calls


def config_window(config: Any, layer: int) -> int | None:
    """The layer's window as transformers' masks apply it: `layer_types` when present, else `sliding_window`
    for every layer (Mistral, Mixtral, Phi-3 build a sliding mask for all layers when it is set)."""
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if types:
        return window if types[layer] == "sliding_attention" else None
    return window


def layer_attention(config: Any, layer: int, call: ProbeCall) -> LayerAttention:
    window = config_window(config, layer)
    asked = call.kwargs.get("sliding_window")
    if asked is not None and asked != window:
        raise refuse(config, f"layer {layer} asks for window {asked} but its config gives {window}")
    softcap = call.kwargs.get("softcap")
    if softcap is None and getattr(config, "attn_logit_softcapping", None) is not None:
        raise refuse(
            config, f"layer {layer}: the config sets attn_logit_softcapping but the layer passes none"
        )
    scale = call.kwargs.get("scaling")
    return LayerAttention(
        scale=float(scale) if scale is not None else call.head_dim**-0.5,
        window=int(window) if window is not None else None,
        softcap=float(softcap) if softcap is not None else None,
    )

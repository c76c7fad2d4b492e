"""Which of a transformers model's modules become sharded ones under tensor parallelism, or why it cannot split.

The model's config declares the split per module name in `base_model_tp_plan` (transformers writes one for most
architectures), relative to the base model, e.g. {"layers.*.self_attn.q_proj": "colwise", ...}:

    colwise                        nn.Linear -> ColumnParallelLinear (q/k/v by heads, gate/up by columns)
    rowwise                        nn.Linear -> RowParallelLinear (o_proj, down_proj: one all-reduce each)
                                   (the native model's layers: engine/distributed/parallel_linear.py)
    replicated_with_grad_allreduce kept whole on every rank (per-head q/k norms)
    anything else                  refused (gathered outputs, packed or expert layers need code we lack)

The input embedding and the output head become vocabulary-parallel whatever the plan says
(engine/distributed/vocab_parallel.py). Everything not named (norms, rotary, other modules) stays whole on every
rank. Works on a model built on the meta device: the new modules' parameters are made there too, each with the
weight loader that reads its slice (engine/distributed/weight_loader.py).
"""

from __future__ import annotations

import re
from typing import Any, cast

import torch
from torch import nn

from engine.distributed.group import TPGroup
from engine.distributed.parallel_linear import RowParallelLinear, column_linear, kv_rows
from engine.distributed.partition import Span, check_model_splits, kv_heads_per_rank
from engine.distributed.vocab_parallel import ParallelLMHead, VocabParallelEmbedding
from engine.models.generic.checks import refuse

SPLIT_STYLES = ("colwise", "rowwise")
WHOLE_STYLES = ("replicated_with_grad_allreduce",)
KV_PROJECTIONS = ("k_proj", "v_proj")  # column-split by KV head (replicated when fewer heads than ranks)
_EXPERT_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts")


def check_splits(config: Any, size: int) -> None:
    """Refuse (UnsupportedModelError naming the reason) a config whose model cannot split over `size` ranks."""
    text = config.get_text_config()
    experts = [f for f in _EXPERT_FIELDS if getattr(text, f, None)]
    if experts:
        raise refuse(config, f"mixture-of-experts layers ({', '.join(experts)}) are not split across ranks")
    if not getattr(text, "base_model_tp_plan", None):
        raise refuse(
            config, "its config declares no tensor-parallel plan (base_model_tp_plan): which modules to split"
        )
    heads = text.num_attention_heads
    try:
        check_model_splits(
            heads,
            getattr(text, "num_key_value_heads", None) or heads,
            getattr(text, "intermediate_size", None) or size,
            size,
        )
    except ValueError as e:
        raise refuse(config, str(e)) from e


def shard_modules(hf: Any, group: TPGroup) -> None:
    """Replace, in place, every module the plan splits and the embeddings by this rank's sharded modules."""
    config = hf.config
    text = config.get_text_config()
    check_splits(config, group.size)
    modules = dict(hf.named_modules())
    embedding_names = {n for n, m in modules.items() if m is hf.get_input_embeddings()}
    split = 0
    for pattern, style in text.base_model_tp_plan.items():
        names = _matching(modules, f"{hf.base_model_prefix}.{pattern}") - embedding_names
        if not names or style in WHOLE_STYLES:
            continue
        if "experts" in pattern:
            raise refuse(config, f"mixture-of-experts layers ({pattern}) are not split across ranks")
        if style not in SPLIT_STYLES:
            raise refuse(
                config,
                f"its tensor-parallel plan splits {pattern} as {style!r}; only {', '.join(SPLIT_STYLES)} "
                "(and replicated) modules are supported",
            )
        for name in sorted(names):
            linear = modules[name]
            if type(linear) is not nn.Linear:
                raise refuse(
                    config, f"{name} is a {type(linear).__name__}, not the nn.Linear its plan splits"
                )
            _replace(hf, name, _split(config, name, linear, style, group))
            split += 1
    if not split:  # every layer whole on every rank: it would run, but N times the memory for nothing
        raise refuse(config, "its tensor-parallel plan (base_model_tp_plan) names none of its linear layers")
    _shard_vocabulary(hf, group)
    _set_head_counts(hf, text, group)


def _matching(modules: dict[str, nn.Module], pattern: str) -> set[str]:
    regex = re.compile(re.escape(pattern).replace(r"\*", r"\d+") + "$")
    return {n for n in modules if regex.match(n)}


def _split(config: Any, name: str, linear: nn.Linear, style: str, group: TPGroup) -> nn.Module:
    dtype, bias = linear.weight.dtype, linear.bias is not None
    try:
        with torch.device("meta"):
            if style == "rowwise":
                return RowParallelLinear(
                    linear.in_features, linear.out_features, bias, group, dtype, what=name
                )
            rows = _kv_rows(config, name, linear, group)
            return column_linear(linear.in_features, linear.out_features, bias, group, dtype, rows)
    except ValueError as e:
        raise refuse(config, str(e)) from e


def _kv_rows(config: Any, name: str, linear: nn.Linear, group: TPGroup) -> Span | None:
    """A k or v projection's rows: this rank's KV heads (replicated when fewer than the ranks); None (an even
    split of the output features) for any other column-parallel layer."""
    if name.rsplit(".", 1)[-1] not in KV_PROJECTIONS:
        return None
    text = config.get_text_config()
    kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    return kv_rows(kv_heads, linear.out_features // kv_heads, group)


def _shard_vocabulary(hf: Any, group: TPGroup) -> None:
    embedding, head = hf.get_input_embeddings(), hf.get_output_embeddings()
    scale = getattr(embedding, "embed_scale", None)  # a 0-d tensor, already filled: kept as it is
    scaled = isinstance(scale, torch.Tensor)
    if not isinstance(embedding, nn.Embedding) or (type(embedding) is not nn.Embedding and not scaled):
        raise refuse(hf.config, f"its input embedding {type(embedding).__name__} is not a plain nn.Embedding")
    if type(head) is not nn.Linear:
        raise refuse(hf.config, f"its output head {type(head).__name__} is not an nn.Linear")
    tied = head.weight is embedding.weight
    vocab, dtype = embedding.num_embeddings, embedding.weight.dtype
    with torch.device("meta"):
        rows = VocabParallelEmbedding(vocab, embedding.embedding_dim, group, dtype, scale if scaled else None)
        logits = ParallelLMHead(head.out_features, head.in_features, group, head.bias is not None, dtype)
    if tied:  # same row split, so the head's shard is the embedding's
        logits.weight = rows.weight
    names = {m: n for n, m in hf.named_modules()}
    _replace(hf, names[embedding], rows)
    _replace(hf, names[head], logits)


def whole_head(hf: Any) -> None:
    """One process: the model's own nn.Linear output head becomes a one-rank ParallelLMHead sharing its
    parameters (the same product, and the sliced CPU form). Any other head is left as it is."""
    head = hf.get_output_embeddings()
    if type(head) is not nn.Linear:
        return
    with torch.device("meta"):
        new = ParallelLMHead(head.out_features, head.in_features, TPGroup.single(), head.bias is not None)
    # The same Parameters (nn.Linear declares them as Tensors): a tie to the embedding stays.
    new.weight, new.bias = cast(nn.Parameter, head.weight), cast("nn.Parameter | None", head.bias)
    names = {m: n for n, m in hf.named_modules()}
    _replace(hf, names[head], new)


def _set_head_counts(hf: Any, text: Any, group: TPGroup) -> None:
    """Attention modules that keep head counts as attributes get this rank's (most compute them from the
    projections' widths; the loader's probe checks the counts the attention calls see)."""
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    local = {"heads": heads // group.size, "kv": kv_heads_per_rank(kv_heads, group.size)}
    for module in hf.modules():
        if getattr(module, "num_heads", None) == heads:
            module.num_heads = local["heads"]
        if getattr(module, "num_key_value_heads", None) == kv_heads:
            module.num_key_value_heads = local["kv"]
        if hasattr(module, "num_key_value_groups"):
            module.num_key_value_groups = local["heads"] // local["kv"]


def _replace(root: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, leaf, new)

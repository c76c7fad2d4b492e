"""quantize_model: swap a loaded native model's linear projections for quantized kernels, in place.

    auto          a GGUF file's own precision where a kernel serves it exactly (`raw` given): Q4_0/Q4_1 ->
                  int4 group 32, Q8_0 -> int8 when each row has one scale; everything else as loaded.
                  Without `raw` (a safetensors checkpoint): nothing changes.
    none          nothing changes (a GGUF file's weights stay as loaded, i.e. dequantized).
    int8, int4    weight-only, quantized from the loaded weights; int4 takes a GGUF file's Q4_0/Q4_1 blocks
                  and int8 its exact Q8_0 blocks as they are rather than rounding the loaded weights again.
    fp8           e4m3 weights and per-token activations through torch._scaled_mm (CUDA, sm_89+ only).
    fp8-emulated  the same roundings multiplied in float32 anywhere: a fidelity check, not an engine option.

What is quantized: q/k/v, o, gate/up and down of every layer (the column- and row-parallel layers), and in
`auto` and `int4` with `raw` the LM head from the file's own blocks (Q4_0/Q4_1 as int4, Q8_0 as an exact
pair of int4 halves: engine/quant/lm_head.py); a tied head keeps the embedding's table for large batches.
Otherwise the head stays in the serving dtype: rounding it again moves the logits most directly. The
embedding (a row lookup, no packed kernel) and the norms stay as loaded.
A layer whose shape a kernel cannot take stays as loaded, counted in the summary.

Tensor parallelism: each rank quantizes the shard it holds (a row-parallel layer's all_reduce follows its
kernel); a GGUF file's blocks are sliced to the rank's rows, or to its columns when they fall on 32-blocks.

`raw(name) -> (qtype, blocks uint8 [rows, bytes_per_row], (rows, cols))` (or None / KeyError when the file has
no such 2-D tensor) gives the file's blocks of a weight under its checkpoint name in HF form
(`model.layers.3.self_attn.q_proj.weight`, or the same without `model.`), rows in our order (Q/K already
un-permuted).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from engine.distributed.parallel_linear import ColumnParallelLinear, RowParallelLinear
from engine.distributed.vocab_parallel import ParallelLMHead
from engine.quant.fp8 import Fp8Weight, fp8_device_refusal, fp8_shape_refusal
from engine.quant.gguf_blocks import (
    BLOCK,
    BLOCK_BYTES,
    INT4_TYPES,
    q4_to_int4,
    q8_0_per_channel,
    q8_0_to_int8,
    qtype_name,
)
from engine.quant.int4 import GROUP_SIZE, Int4Weight, int4_unfit_reason, quantize_int4
from engine.quant.int8 import Int8Weight, quantize_int8
from engine.quant.linear import QuantLinear
from engine.quant.lm_head import quant_lm_head

RawBlocks = tuple[Any, np.ndarray, tuple[int, int]]
Raw = Callable[[str], RawBlocks | None]
MODES = ("auto", "none", "int8", "int4", "fp8", "fp8-emulated")
# Checkpoint projection names of our fused layers' parts.
_PART_NAMES = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "gate": "gate_proj", "up": "up_proj"}


@dataclass(frozen=True)
class QuantSummary:
    mode: str
    layers: dict[str, int] = field(default_factory=dict)  # what each linear layer became -> how many
    lm_head: str = "as loaded"  # what the LM head became


def quantize_model(model: nn.Module, mode: str, raw: Raw | None = None) -> QuantSummary:
    """Quantize `model`'s linear projections in place (see the module docstring); returns what was done."""
    if mode not in MODES:
        raise ValueError(f"quantization must be one of {', '.join(MODES)}; got {mode!r}")
    if mode == "none" or (mode == "auto" and raw is None):
        return QuantSummary(mode)
    targets = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, (ColumnParallelLinear, RowParallelLinear))
    ]
    if mode == "fp8" and targets:
        refusal = fp8_device_refusal(targets[0][1].weight.device)
        if refusal is not None:
            raise ValueError(refusal)
    kinds: Counter[str] = Counter()
    for name, module in targets:
        blocks = _rank_blocks(raw, name, module) if raw is not None else None
        kind, kernel = _kernel(mode, module.weight, blocks)
        kinds[kind] += 1
        if kernel is not None:
            reduce = module.tp if isinstance(module, RowParallelLinear) else None
            _replace(model, name, QuantLinear(kernel, module.bias, reduce, kind))
    head = _quantize_head(model, raw) if raw is not None and mode in ("auto", "int4") else "as loaded"
    return QuantSummary(mode, dict(kinds), head)


def _quantize_head(model: nn.Module, raw: Raw) -> str:
    """Serve the LM head from the file's blocks where it can be exactly (lm_head.py); what it became."""
    head = getattr(model, "lm_head", None)
    if not isinstance(head, ParallelLMHead):
        return "as loaded"
    embed = getattr(model, "embed_tokens", None)
    tied = embed is not None and head.weight is getattr(embed, "weight", None)
    # Tied: the head is the embedding's table, stored under the embedding's name.
    got = _read(raw, "model.embed_tokens.weight" if tied else "lm_head.weight")
    if got is None:
        return "as loaded"
    new = quant_lm_head(head, *got, tied=tied)
    if isinstance(new, str):
        return new
    _replace(model, "lm_head", new)
    return new.kind


def weight_bytes(model: nn.Module) -> int:
    """Bytes the model's parameters and buffers take, each tensor once (tied weights are one tensor)."""
    seen: dict[int, int] = {}
    for t in [*model.parameters(), *model.buffers()]:
        seen[id(t)] = t.numel() * t.element_size()
    return sum(seen.values())


def _kernel(mode: str, w: torch.Tensor, blocks: list[RawBlocks] | None) -> tuple[str, nn.Module | None]:
    """(what the layer becomes, its kernel or None to keep it as loaded)."""
    n, k = w.shape
    device, dtype = w.device, w.dtype
    types = sorted({qtype_name(q) for q, _, _ in blocks}) if blocks else []
    loaded = f"as loaded ({'/'.join(types)})" if types else "as loaded"
    unfit4 = int4_unfit_reason(n, k, GROUP_SIZE, device, dtype)
    if blocks and mode in ("auto", "int4") and set(types) <= set(INT4_TYPES):
        if unfit4 is not None:
            return f"{loaded}: {unfit4}", None
        parts = [q4_to_int4(*b) for b in blocks]
        codes, scale, zero = (torch.cat([p[i] for p in parts]) for i in range(3))
        kind = f"int4 g{GROUP_SIZE} ({'/'.join(types)} blocks)"
        return kind, Int4Weight(codes, scale, zero, dtype, device)
    if blocks and mode in ("auto", "int8") and types == ["Q8_0"]:
        q8 = [q8_0_to_int8(data, shape) for _, data, shape in blocks]
        scales = [q8_0_per_channel(d) for _, d in q8]
        if all(s is not None for s in scales):
            scale = torch.cat([s for s in scales if s is not None])
            return "int8 (Q8_0 blocks)", Int8Weight(torch.cat([q for q, _ in q8]), scale, dtype, device)
    if mode == "auto":
        return loaded, None
    if mode == "int4":
        if unfit4 is not None:
            return f"{loaded}: {unfit4}", None
        return f"int4 g{GROUP_SIZE}", Int4Weight(*quantize_int4(w, GROUP_SIZE), dtype, device)
    if mode == "int8":
        return "int8", Int8Weight(*quantize_int8(w), dtype, device)
    if mode == "fp8":
        reason = fp8_shape_refusal(n, k)
        return (f"{loaded}: {reason}", None) if reason else ("fp8", Fp8Weight(w, device))
    return "fp8-emulated", Fp8Weight(w, device, emulate=True)


def _rank_blocks(raw: Raw, name: str, module: nn.Module) -> list[RawBlocks] | None:
    """The file's blocks of this rank's part of a layer, one entry per fused part; None when the file has
    no blocks for some part or they cannot be cut to this rank's columns."""
    parent, _, own = name.rpartition(".")
    base = "model." + (parent + "." if parent else "")
    out: list[RawBlocks] = []
    if isinstance(module, ColumnParallelLinear):
        for shard, seg in module.segments.items():
            got = _read(raw, base + (_PART_NAMES[shard] if shard else own) + ".weight")
            if got is None:
                return None
            qtype, data, shape = got
            if shape != (seg.full_rows, module.in_features):
                raise ValueError(
                    f"{base}{shard}: file shape {shape} != ({seg.full_rows}, {module.in_features})"
                )
            out.append((qtype, data[seg.rows.start : seg.rows.stop], (seg.rows.length, shape[1])))
        return out
    assert isinstance(module, RowParallelLinear)
    got = _read(raw, base + own + ".weight")
    if got is None:
        return None
    qtype, data, shape = got
    if shape != (module.out_features, module.in_features):
        raise ValueError(f"{base}{own}: file shape {shape} != ({module.out_features}, {module.in_features})")
    span = module.span
    if span.length == shape[1]:
        return [got]
    per_block = BLOCK_BYTES.get(qtype_name(qtype))
    if per_block is None or span.start % BLOCK or span.length % BLOCK:
        return None  # this rank's columns split a block: keep the loaded (dequantized) shard
    cols = slice(span.start // BLOCK * per_block, span.stop // BLOCK * per_block)
    return [(qtype, data[:, cols], (shape[0], span.length))]


def _read(raw: Raw, name: str) -> RawBlocks | None:
    """raw(name) under the HF name, else under the same name without "model." (the form our parameter names
    take, which a checkpoint's rename may produce); None when neither is there."""
    for candidate in (name, name.removeprefix("model.")):
        try:
            got = raw(candidate)
        except KeyError:
            continue
        if got is not None:
            return got
    return None


def _replace(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, attr = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, attr, new)

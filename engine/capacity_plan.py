"""`conveyor plan`: a capacity plan from config.json alone (or a GGUF file's metadata): weights, KV per
token, blocks, concurrency, and the memory each concurrent user needs.
It parses config.json with the engine's ModelArgs (the Llama family) or transformers (every other family,
engine/models/generic/shape.py) and sizes the pool with the engine's own rule (engine/kv_sizing.py):

    KV bytes per block = block_size * num_layers * 2 (K and V) * num_kv_heads * head_dim * dtype bytes
    blocks             = (memory - weights - activation reserve) // KV bytes per block, capped as the engine
                         caps a pool (2 x max_num_seqs sequences of max_model_len)
    KV per user        = ceil(tokens / block_size) * KV bytes per block   (printed for a 1k-token user)
    concurrent seqs    = blocks // ceil(min(seq_len, max_model_len) / block_size)

The activation reserve is an estimate of one step's transient tensors (kv_sizing.activation_estimate): for
every batched token the hidden state, residual, qkv and the gate/up output in the model dtype, plus float32
logits for every sampled row. The engine on CUDA measures it instead, with a warm-up forward.

With `tensor_parallel_size` N every figure is per GPU: the split weights (attention heads, MLP columns, the
vocabulary padded to a multiple of N) count 1/N, KV heads `kv_heads_per_rank` (replicated when fewer than N),
norms whole; the same rules the loaders use (engine/distributed/partition.py; the generic path splits a
meta-device model with its own loader's code). A model that cannot split raises ValueError naming the reason.

`quantization` (int8, int4, fp8) counts the linear projections (q/k/v, o, gate/up, down) as the kernels in
engine/quant store them, scales included (engine/quant/memory.py); embeddings and norms stay in `dtype`,
and the LM head too, except a GGUF file's under int4 (served from the file's Q4_0/Q4_1/Q8_0 blocks, as the
engine does). Native (Llama-family) models only, as in the engine.

Sliding-window layers are listed but save nothing here: the engine keeps every block of a sequence until
it finishes (no block is freed when it slides out of the windows), so KV per token counts every layer.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from engine.config import engine_default
from engine.distributed.partition import check_model_splits, kv_heads_per_rank, padded_vocab
from engine.kv_sizing import (
    activation_estimate,
    bytes_per_user,
    kv_bytes_per_token,
    kv_pool_size,
    most_blocks_usable,
)
from engine.models.config import ModelArgs
from engine.models.registry import is_native
from engine.quant.memory import PLAN_QUANTIZATIONS, linear_bytes

if TYPE_CHECKING:
    from engine.models.generic.shape import GenericShape

_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class Plan:
    num_params: int  # the whole model's
    weight_bytes: int  # per GPU, as every byte figure below
    kv_bytes_per_token: int
    kv_bytes_per_block: int
    activation_reserve_bytes: int
    memory_bytes: int
    kv_budget_bytes: int
    num_blocks: int  # capped as the engine caps a pool sized from memory
    block_size: int
    max_model_len: int
    dtype: str
    # seq_len -> how many sequences of that length fit in the KV pool at once
    concurrency: dict[int, int]
    max_num_seqs: int = engine_default("max_num_seqs")
    # Per layer: its sliding window, or None (full attention). Informational: KV bytes do not shrink.
    layer_windows: tuple[int | None, ...] = ()
    tensor_parallel_size: int = 1
    params_per_gpu: int | None = None  # None: num_params (one GPU)
    quantization: str = "none"
    blocks_fit: int | None = None  # before the cap; None: the same as num_blocks

    @property
    def kv_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def kv_bytes_per_user(self, tokens: int) -> int:
        """KV memory one concurrent sequence of `tokens` tokens needs (whole blocks)."""
        return bytes_per_user(tokens, self.block_size, self.kv_bytes_per_block)


def count_params(args: ModelArgs, tensor_parallel_size: int = 1) -> int:
    """Parameters of a Llama-family model (q/k/v/o, gated MLP, norms, embeddings, optional untied head) that
    one of `tensor_parallel_size` ranks holds (all of them for 1)."""
    n = tensor_parallel_size
    check_model_splits(args.num_heads, args.num_kv_heads, args.intermediate_size, n)
    h, d = args.hidden_size, args.head_dim
    q, kv = args.num_heads // n * d, kv_heads_per_rank(args.num_kv_heads, n) * d
    inter, vocab = args.intermediate_size // n, padded_vocab(args.vocab_size, n) // n
    qkv = q + 2 * kv
    bias = qkv if args.qkv_bias else 0
    qk_norm = 2 * d if args.qk_norm else 0
    layer = h * qkv + bias + q * h + 3 * h * inter + 2 * h + qk_norm
    head = 0 if args.tie_word_embeddings else vocab * h
    return vocab * h + args.num_layers * layer + h + head


def linear_shapes(args: ModelArgs, tensor_parallel_size: int = 1) -> list[tuple[int, int]]:
    """[out, in] of one layer's projections on one rank: fused q/k/v, o, fused gate/up, down."""
    n, h, d = tensor_parallel_size, args.hidden_size, args.head_dim
    q, kv = args.num_heads // n * d, kv_heads_per_rank(args.num_kv_heads, n) * d
    inter = args.intermediate_size // n
    return [(q + 2 * kv, h), (h, q), (2 * inter, h), (h, inter)]


def native_weight_bytes(args: ModelArgs, tensor_parallel_size: int, quantization: str, item: int) -> int:
    """One rank's weight bytes: the projections as `quantization` stores them, everything else in `item`."""
    shapes = linear_shapes(args, tensor_parallel_size) * args.num_layers
    rest = count_params(args, tensor_parallel_size) - sum(n * k for n, k in shapes)
    return rest * item + sum(linear_bytes(n, k, quantization, item) for n, k in shapes)


def config_layer_windows(cfg: dict) -> tuple[int | None, ...]:
    """The engine's per-layer windows for a native family; otherwise the generic reading (`layer_types`
    marks the windowed layers, else `sliding_window` applies to all, unless `use_sliding_window` is false)."""
    from engine.models.config import UnsupportedModelError, family_of, layer_windows

    try:
        return layer_windows(cfg, family_of(cfg))
    except UnsupportedModelError:
        pass
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window", True) else None
    types = cfg.get("layer_types") or ["sliding_attention"] * cfg["num_hidden_layers"]
    return tuple(window if t == "sliding_attention" else None for t in types)


def plan(
    config_path_or_dir: str | Path,
    memory_bytes: int,
    max_model_len: int | None = None,
    dtype: str = "bfloat16",
    block_size: int = engine_default("block_size"),
    seq_lens: Sequence[int] | None = None,
    *,
    max_num_batched_tokens: int = engine_default("max_num_batched_tokens"),
    max_num_seqs: int = engine_default("max_num_seqs"),
    tensor_parallel_size: int = engine_default("tensor_parallel_size"),
    quantization: str = "none",
) -> Plan:
    """dtype and quantization name what is sized: no "auto" (a GGUF file's own precision) here; the other
    sizes default to the engine's."""
    path = Path(config_path_or_dir)
    cfg = _read_config(path)
    if dtype not in _ITEMSIZE:
        raise ValueError(f"dtype must be one of {', '.join(_ITEMSIZE)}, got {dtype!r}")
    item = _ITEMSIZE[dtype]
    if quantization not in PLAN_QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {', '.join(PLAN_QUANTIZATIONS)}, got {quantization!r}")
    args: ModelArgs | GenericShape
    n = tensor_parallel_size
    if is_native(cfg):
        # The engine's own parsing: the same head_dim, kv heads and family switches the loader will use.
        args = ModelArgs.from_hf(cfg)
        params, per_gpu = count_params(args), count_params(args, n)
        weights = native_weight_bytes(args, n, quantization, item)
        if quantization == "int4":
            weights += _gguf_head_extra(path, args, n, item)
    else:  # the generic path: transformers reads the config, parameters counted on a meta-device model
        from engine.models.generic.shape import generic_shape

        args = generic_shape(cfg, n)
        if quantization != "none":
            raise ValueError(f"quantization {quantization} applies to native (Llama-family) models only")
        params, per_gpu = args.num_params, args.num_params_per_rank
        weights = per_gpu * item
    kv_heads = kv_heads_per_rank(args.num_kv_heads, n)
    per_token = kv_bytes_per_token(args.num_layers, kv_heads, args.head_dim, item)
    per_block = per_token * block_size
    qkv = (args.num_heads // n + 2 * kv_heads) * args.head_dim
    reserve = activation_estimate(
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
        hidden_size=args.hidden_size,
        qkv_width=qkv,
        intermediate_size=args.intermediate_size // n,
        vocab_size=args.vocab_size,  # rank 0 gathers every rank's logits columns
        itemsize=item,
    )
    model_len = max_model_len or args.max_position_embeddings
    size = kv_pool_size(
        memory_bytes - weights, reserve, per_block, most_blocks_usable(max_num_seqs, model_len, block_size)
    )
    blocks = size.blocks
    if seq_lens is None:  # a short, a medium and a full-length sequence
        seq_lens = sorted({max(1, model_len // 8), max(1, model_len // 2), model_len})
    too_long = [n for n in seq_lens if n > model_len or n < 1]
    if too_long:
        raise ValueError(f"sequence lengths {too_long} are outside 1..max_model_len ({model_len})")
    concurrency = {n: blocks // math.ceil(n / block_size) for n in seq_lens}
    return Plan(
        num_params=params,
        weight_bytes=weights,
        kv_bytes_per_token=per_token,
        kv_bytes_per_block=per_block,
        activation_reserve_bytes=reserve,
        memory_bytes=memory_bytes,
        kv_budget_bytes=size.budget_bytes,
        num_blocks=blocks,
        block_size=block_size,
        max_model_len=model_len,
        dtype=dtype,
        concurrency=concurrency,
        max_num_seqs=max_num_seqs,
        layer_windows=config_layer_windows(cfg),
        tensor_parallel_size=n,
        params_per_gpu=per_gpu if n > 1 else None,
        quantization=quantization,
        blocks_fit=size.fits if size.capped else None,
    )


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    raise AssertionError


def _count(n: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(n)


def format_plan(p: Plan) -> str:
    kind = p.dtype if p.quantization == "none" else f"{p.quantization} projections, the rest {p.dtype}"
    lines = [f"parameters          {_count(p.num_params)}  ({kind}: weights {_size(p.weight_bytes)})"]
    if p.tensor_parallel_size > 1:
        lines = [
            f"tensor parallel     {p.tensor_parallel_size} GPUs; every size below is per GPU",
            f"parameters          {_count(p.num_params)}, {_count(p.params_per_gpu or 0)} per GPU  "
            f"({kind}: weights {_size(p.weight_bytes)} per GPU)",
        ]
    lines += [
        f"KV per token        {_size(p.kv_bytes_per_token)}",
        f"KV per block        {_size(p.kv_bytes_per_block)}  (block_size {p.block_size})",
        f"memory budget       {_size(p.memory_bytes)}",
        f"activation reserve  {_size(p.activation_reserve_bytes)}  (one step's transient tensors + fp32 logits)",
        f"KV pool             {_size(p.kv_budget_bytes)} -> {p.num_blocks} blocks = {p.kv_tokens} tokens"
        + (
            f" (capped: {p.blocks_fit} fit; more only keeps freed prefix blocks)"
            if p.blocks_fit is not None
            else ""
        ),
        f"KV per 1k-token user {_size(p.kv_bytes_per_user(1000))}  "
        f"(ceil(1000 / {p.block_size}) blocks x {_size(p.kv_bytes_per_block)})",
        f"max_model_len       {p.max_model_len}",
    ]
    windowed = sorted({w for w in p.layer_windows if w is not None})
    if windowed:
        count = sum(w is not None for w in p.layer_windows)
        lines.append(
            f"sliding windows     {count} of {len(p.layer_windows)} layers ({', '.join(map(str, windowed))} tokens);"
            " KV above counts them in full: blocks are not freed as they slide out"
        )
    if p.num_blocks == 0:
        lines.append("WARNING: the weights and reserve leave no room for the KV cache")
    for n, k in p.concurrency.items():
        capped = f" (the scheduler runs at most max_num_seqs={p.max_num_seqs})" if k > p.max_num_seqs else ""
        lines.append(f"sequences of {n:>6} tokens at once: {k}{capped}")
    return "\n".join(lines)


def _gguf_head_extra(path: Path, args: ModelArgs, n: int, item: int) -> int:
    """What a GGUF file's LM head on the int4 kernel adds to one rank's weights (0 for other checkpoints)."""
    from engine.gguf_files import is_gguf

    if not is_gguf(path):
        return 0
    from engine.gguf_files.checkpoint import GGUFCheckpoint
    from engine.quant.memory import int4_head_extra_bytes

    ckpt = GGUFCheckpoint(path)
    name = "model.embed_tokens.weight" if args.tie_word_embeddings else "lm_head.weight"
    rows = padded_vocab(args.vocab_size, n) // n
    return int4_head_extra_bytes(
        ckpt.qtype_name(name), rows, args.hidden_size, args.tie_word_embeddings, item
    )


def _read_config(path: Path) -> dict:
    """config.json (a folder or the file itself), or a GGUF file's metadata read as one."""
    from engine.gguf_files import is_gguf

    if is_gguf(path):
        from engine.gguf_files.checkpoint import GGUFCheckpoint

        return GGUFCheckpoint(path).config
    return dict(json.loads((path / "config.json" if path.is_dir() else path).read_text()))

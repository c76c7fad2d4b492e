"""Load a HF checkpoint folder (or hub id) into our model code, plus a small frozen ModelSpec.

Under tensor parallelism (`tp` with size > 1) each rank builds its part of the model and reads only its
slices of each checkpoint tensor (engine/checkpoint.py's lazy slices, filled by each parameter's weight
loader): no rank holds a whole sharded weight.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import structlog
import torch

from engine.attention.backend import AttentionBackend, get_attention_backend
from engine.checkpoint import Checkpoint
from engine.device import resolve_device
from engine.distributed.group import TPGroup
from engine.distributed.partition import check_model_splits, even_span, kv_heads_per_rank
from engine.distributed.vocab_parallel import ParallelLMHead
from engine.distributed.weight_loader import load_parameters, materialize
from engine.dtype_rules import resolve_dtype
from engine.gguf_files import is_gguf
from engine.models import LlamaForCausalLM, ModelArgs, build_model, map_weight_name
from engine.models.config import config_dtype, config_ids
from engine.models.registry import is_native
from engine.quant import quantize_model, weight_bytes
from engine.quant.apply import Raw
from engine.quant.fp8 import fp8_device_refusal

log = structlog.get_logger("conveyor.engine")

if TYPE_CHECKING:
    from engine.gguf_files.checkpoint import GGUFCheckpoint
    from engine.models.generic.model import TransformersCausalLM

MODEL_IMPLS = ("auto", "native", "transformers")


@dataclass(frozen=True)
class ModelSpec:
    """What the rest of the engine needs to know about the model: sizes for the KV pool, ids for stopping.

    Under tensor parallelism this is one rank's view: `num_heads` and `num_kv_heads` are the heads THIS rank
    holds (num_attention_heads / tp_size, and its KV heads, replicated when there are fewer than tp_size),
    which is what its KV pool is sized by. `vocab_size` stays the whole vocabulary: rank 0's logits are full.
    """

    num_layers: int
    num_heads: int  # this rank's query heads
    num_kv_heads: int  # this rank's KV heads
    head_dim: int
    hidden_size: int
    vocab_size: int  # the whole vocabulary (the width of rank 0's logits)
    max_position_embeddings: int
    dtype: torch.dtype
    eos_token_ids: frozenset[int]
    tp_size: int = 1


def resolve_model_dir(model: str | Path) -> Path:
    """A local folder as is; otherwise a hub id fetched (or found in the local cache) by huggingface_hub."""
    path = Path(model)
    if path.is_dir():
        return path
    try:
        from huggingface_hub import snapshot_download

        return Path(
            snapshot_download(str(model), allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt"])
        )
    except Exception as e:  # offline, unknown id, no network: one clear message
        raise FileNotFoundError(
            f"{model!r} is not a local folder and could not be fetched from the hub ({type(e).__name__}: {e})"
        ) from e


def read_eos_ids(model_dir: Path, config_eos: tuple[int, ...]) -> frozenset[int]:
    ids = set(config_eos)
    gen = model_dir / "generation_config.json"
    if gen.exists():
        value = json.loads(gen.read_text()).get("eos_token_id")
        ids.update(value if isinstance(value, list) else [] if value is None else [value])
    return frozenset(int(i) for i in ids)


def load_weights(model: LlamaForCausalLM, source: Path | GGUFCheckpoint) -> None:
    """Fill every parameter with this rank's slice of its checkpoint tensor; fused q/k/v and gate/up are
    filled part by part (each parameter's weight loader reads only its rows or columns). `source`: a
    checkpoint folder, or an open GGUF file (engine/gguf_files/)."""
    with Checkpoint(source) if isinstance(source, Path) else source as ckpt:
        load_parameters(model, ckpt, map_weight_name, _shards)


def use_sliced_head(model: torch.nn.Module, device: torch.device) -> None:
    """The LM head's form, chosen once when the model is placed: the sliced matmul is for the host's
    caches; a GPU takes one F.linear."""
    head = getattr(model, "lm_head", None)
    if isinstance(head, ParallelLMHead):
        head.sliced = device.type == "cpu"


def _shards(param_name: str) -> tuple[str | None, ...]:
    if ".qkv_proj." in param_name:
        return ("q", "k", "v")
    if ".gate_up_proj." in param_name:
        return ("gate", "up")
    return (None,)


def load_model(
    model: str | Path,
    dtype: str | torch.dtype = "auto",
    device: str | torch.device = "cpu",
    attention_backend: AttentionBackend | None = None,
    model_impl: str = "auto",
    tp: TPGroup | None = None,
    quantization: str = "auto",
) -> tuple[LlamaForCausalLM | TransformersCausalLM, ModelSpec]:
    """Build the model for a HF checkpoint and load its weights. Returns (model in eval mode, spec).

    `attention_backend`: the engine's, resolved once; None (tests, tools) -> the device's default.
    `model_impl`: "native" (our Llama-family code), "transformers" (the model's own transformers code on our
    paged attention, engine/models/generic/), or "auto": native for the Llama family, transformers otherwise.
    `tp`: this process's rank in its tensor-parallel group (None: the whole model here). Every rank calls
    load_model with its own group; the spec it gets back describes that rank's part (see ModelSpec).
    `quantization`: engine/quant/apply.py's modes, applied to the native model after its weights load."""
    tp = tp or TPGroup.single()
    if model_impl not in MODEL_IMPLS:
        raise ValueError(f"model_impl must be one of {', '.join(MODEL_IMPLS)}; got {model_impl!r}")
    device = resolve_device(device)
    refusal = fp8_device_refusal(device) if quantization == "fp8" else None
    if refusal is not None:  # before any weight is read
        raise ValueError(refusal)
    source, cfg = _open(model)
    model_dir = source if isinstance(source, Path) else source.model_dir
    if model_impl == "transformers" or (model_impl == "auto" and not is_native(cfg)):
        if quantization not in ("auto", "none"):
            raise ValueError(
                f"quantization {quantization} runs on the native Llama-family model only; "
                f"{cfg.get('architectures') or cfg.get('model_type')} loads on the transformers path"
            )
        generic, spec_ = _load_generic(source, cfg, dtype, device, attention_backend, tp)
        quantize_and_report(generic, "none", tp)  # the log line of what the weights take
        return generic, spec_
    args = ModelArgs.from_hf(cfg)
    check_model_splits(args.num_heads, args.num_kv_heads, args.intermediate_size, tp.size)
    torch_dtype = resolve_dtype(dtype, args.torch_dtype, device)
    # Built on the meta device (no random init, no memory), then materialised empty and filled from disk.
    with torch.device("meta"):
        net = build_model(args, tp).to(torch_dtype)
    materialize(net, device)
    use_sliced_head(net, device)
    load_weights(net, source)
    raw = None if isinstance(source, Path) else _file_blocks(source, quantization, torch_dtype, device)
    quantize_and_report(net, quantization, tp, raw)
    net.attn_backend = attention_backend or get_attention_backend("auto", device)
    net.eval()
    spec = ModelSpec(
        num_layers=args.num_layers,
        num_heads=even_span(args.num_heads, tp.rank, tp.size).length,  # this rank's heads
        num_kv_heads=kv_heads_per_rank(args.num_kv_heads, tp.size),
        head_dim=args.head_dim,
        hidden_size=args.hidden_size,
        vocab_size=args.vocab_size,
        max_position_embeddings=args.max_position_embeddings,
        dtype=torch_dtype,
        eos_token_ids=read_eos_ids(model_dir, args.eos_token_ids),
        tp_size=tp.size,
    )
    return net, spec


def _open(model: str | Path) -> tuple[Path | GGUFCheckpoint, dict]:
    """(checkpoint folder, or the GGUF file opened once, whose metadata is its config; config.json's fields)."""
    if is_gguf(model):
        from engine.gguf_files.checkpoint import GGUFCheckpoint

        ckpt = GGUFCheckpoint(model)
        return ckpt, ckpt.config
    model_dir = resolve_model_dir(model)
    config_path = model_dir / "config.json"
    if not config_path.exists():
        raise FileNotFoundError(f"no config.json in {model_dir}")
    return model_dir, json.loads(config_path.read_text())


def _file_blocks(
    ckpt: GGUFCheckpoint, quantization: str, dtype: torch.dtype, device: torch.device
) -> Raw | None:
    """The GGUF file's own blocks for quantize_model, or None where `auto` dequantizes instead: the CPU's
    int4/int8 kernels are fast with bfloat16 or float16 activations only, so a float32 CPU engine (dtype
    auto's choice there) serves the file dequantized unless int4/int8 is asked for by name."""
    if quantization == "auto" and device.type == "cpu" and dtype == torch.float32:
        log.info(
            "GGUF weights dequantized to float32; --dtype bfloat16 serves the file's own quantized blocks",
            file=str(ckpt.model_dir),
        )
        return None
    return ckpt.raw


def quantize_and_report(net: torch.nn.Module, quantization: str, tp: TPGroup, raw: Raw | None = None) -> None:
    """Quantize the loaded native model (engine/quant) and log, once per rank, what its weights take."""
    summary = quantize_model(net, quantization, raw)
    size = weight_bytes(net)
    first = next(net.parameters())  # the embedding: the serving dtype and device
    packed = any(kind.startswith(("int8", "int4")) for kind in summary.layers)
    if packed and first.dtype == torch.float32 and first.device.type == "cpu":
        log.warning(
            "the CPU int8/int4 kernels are many times slower with float32 activations than with bfloat16: "
            "consider --dtype bfloat16"
        )
    log.info(
        "weights loaded",
        quantization=quantization,
        weight_bytes=size,
        weight_mib=round(size / 2**20, 1),
        linear_layers=summary.layers or "as loaded",
        lm_head=summary.lm_head,
        tp_rank=tp.rank,
    )


def _load_generic(
    source: Path | GGUFCheckpoint,
    cfg: dict,
    dtype: str | torch.dtype,
    device: torch.device,
    attention_backend: AttentionBackend | None,
    tp: TPGroup,
) -> tuple[TransformersCausalLM, ModelSpec]:
    from engine.models.generic.load import load_transformers_model

    torch_dtype = resolve_dtype(dtype, config_dtype(cfg.get("torch_dtype") or cfg.get("dtype")), device)
    net, call = load_transformers_model(source, torch_dtype, device, tp=tp)
    use_sliced_head(net, device)
    net.attn_backend = attention_backend or get_attention_backend("auto", device)
    text = net.hf.config.get_text_config()
    spec = ModelSpec(
        num_layers=text.num_hidden_layers,
        num_heads=call.num_heads,
        num_kv_heads=call.num_kv_heads,
        head_dim=call.head_dim,
        hidden_size=text.hidden_size,
        vocab_size=net.vocab_size,  # the whole vocabulary, not this rank's padded slice
        max_position_embeddings=getattr(text, "max_position_embeddings", None) or 2048,
        dtype=torch_dtype,
        eos_token_ids=read_eos_ids(
            source if isinstance(source, Path) else source.model_dir, config_ids(cfg.get("eos_token_id"))
        ),
        tp_size=tp.size,
    )
    return net, spec

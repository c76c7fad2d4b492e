"""Build one rank's shard of a transformers model, reading only its slices of the checkpoint.

    model on the meta device (no memory)  ->  buffers made real and filled by the model's own init (rotary
    frequencies, embedding scales)  ->  planned modules replaced by sharded ones (tp_shard.py)  ->  every
    parameter given storage and filled by its weight loader from the checkpoint (engine/checkpoint.py): the
    rank's slice for sharded ones, whole otherwise (engine/distributed/weight_loader.py)

No rank ever holds a whole split weight, not even for a moment.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers.conversion_mapping import get_model_conversion_mapping
from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

from engine.checkpoint import Checkpoint
from engine.distributed.group import TPGroup
from engine.distributed.weight_loader import load_parameters, materialize
from engine.models.generic.attention import ATTN_IMPLEMENTATION
from engine.models.generic.checks import refuse
from engine.models.generic.tp_shard import shard_modules

if TYPE_CHECKING:
    from engine.checkpoint import TensorSource
    from engine.gguf_files.checkpoint import GGUFCheckpoint


def load_shard(
    source: Path | GGUFCheckpoint,
    cls: Any,
    config: Any,
    dtype: torch.dtype,
    device: torch.device,
    group: TPGroup,
) -> Any:
    """The causal LM `cls` with this rank's shard of the weights in `source` (a checkpoint folder, or an open
    GGUF file, whose tensors already carry HF names), in eval mode."""
    with torch.device("meta"):
        hf = cls._from_config(config, dtype=dtype, attn_implementation=ATTN_IMPLEMENTATION)
    _fill_buffers(hf, device)
    shard_modules(hf, group)
    materialize(hf, device)
    params = dict(hf.named_parameters(remove_duplicate=False))
    opened: TensorSource = Checkpoint(source, checkpoint_names(hf)) if isinstance(source, Path) else source
    with opened as ckpt:
        used = load_parameters(hf, ckpt, lambda name: (name, None) if name in params else None)
        _load_buffers(hf, ckpt, set(ckpt.names) - used, device)
    return hf.eval()


def checkpoint_names(hf: Any) -> Callable[[str], str]:
    """Checkpoint tensor name -> the model's, by transformers' own renamings for the family (GPT-NeoX's
    `embed_out` is `lm_head`, legacy `gamma`/`beta`, a missing or extra base-model prefix). Tensors that need
    more than a rename (experts stacked, projections fused) are refused: only from_pretrained does that."""
    transforms = get_model_conversion_mapping(hf)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    model_names = dict.fromkeys(hf.state_dict(keep_vars=True))

    def rename(name: str) -> str:
        renamed, converted = rename_source_key(name, renamings, converters, hf.base_model_prefix, model_names)
        if converted is not None:
            raise refuse(
                hf.config,
                f"checkpoint tensor {name} needs a conversion ({converted}) the sharded loader lacks",
            )
        return renamed if renamed in model_names or name not in model_names else name

    return rename


def _fill_buffers(hf: Any, device: torch.device) -> None:
    """Real storage for every buffer, filled by the model's `initialize_weights` (as from_pretrained does for
    buffers the checkpoint lacks); parameters are still on the meta device, where init costs nothing."""
    for name, buffer in list(hf.named_buffers()):
        parent, _, leaf = name.rpartition(".")
        hf.get_submodule(parent)._buffers[leaf] = torch.empty_like(buffer, device=device)
    hf.initialize_weights()


def _load_buffers(hf: Any, ckpt: TensorSource, names: set[str], device: torch.device) -> None:
    """Persistent buffers the checkpoint holds, read whole (their init values otherwise)."""
    buffers = set(hf.state_dict(keep_vars=True)) - set(dict(hf.named_parameters(remove_duplicate=False)))
    for name in sorted(buffers & names):
        parent, _, leaf = name.rpartition(".")
        owner = hf.get_submodule(parent)
        owner._buffers[leaf] = ckpt.slice(name)[:].to(device=device, dtype=owner._buffers[leaf].dtype)

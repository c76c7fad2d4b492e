"""Build one rank's shard of a transformers model, reading only its slices of the checkpoint.

    model on the meta device (no memory)  ->  buffers made real and filled by the model's own init (rotary
    frequencies, embedding scales)  ->  planned modules replaced by sharded ones (tp_shard.py)  ->  every
    parameter read from the safetensors files: the rank's slice (`get_slice`) for sharded ones, whole otherwise

No rank ever holds a whole split weight, not even for a moment.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn
from transformers.conversion_mapping import get_model_conversion_mapping
from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

from engine.distributed.group import TPGroup
from engine.models.generic.attention import ATTN_IMPLEMENTATION
from engine.models.generic.checks import refuse
from engine.models.generic.tensor_parallel import Slice
from engine.models.generic.tp_shard import shard_modules


def load_shard(
    model_dir: Path, cls: Any, config: Any, dtype: torch.dtype, device: torch.device, group: TPGroup
) -> Any:
    """The causal LM `cls` with this rank's shard of the weights in `model_dir`, in eval mode."""
    with torch.device("meta"):
        hf = cls._from_config(config, dtype=dtype, attn_implementation=ATTN_IMPLEMENTATION)
    _fill_buffers(hf, device)
    shard_modules(hf, group)
    with CheckpointReader(model_dir, checkpoint_names(hf)) as reader:
        _load_parameters(hf, reader, device)
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


class CheckpointReader:
    """The model's tensor name -> (open safetensors file, name there); reads whole tensors or one slice."""

    def __init__(self, model_dir: Path, rename: Callable[[str], str] = lambda name: name) -> None:
        self.model_dir = model_dir
        self.rename = rename
        self._stack = ExitStack()
        self._files: dict[str, tuple[Any, str]] = {}

    def __enter__(self) -> CheckpointReader:
        from engine.model_loader import _weight_files

        for path in _weight_files(self.model_dir):
            handle = self._stack.enter_context(safe_open(str(path), framework="pt", device="cpu"))
            self._files.update({self.rename(name): (handle, name) for name in handle.keys()})
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def __contains__(self, name: str) -> bool:
        return name in self._files

    @property
    def names(self) -> set[str]:
        return set(self._files)

    def read(self, name: str, part: Slice | None) -> torch.Tensor:
        handle, stored = self._files[name]
        if part is None:
            return handle.get_tensor(stored)
        view = handle.get_slice(stored)
        extent = view.get_shape()[part.dim]
        stop = min(part.span.stop, extent)
        index = (slice(None),) * part.dim + (slice(part.span.start, stop),)
        tensor = view[index]
        if stop - part.span.start < part.span.length:  # the padded vocabulary's rows past the real ones
            pad = list(tensor.shape)
            pad[part.dim] = part.span.length - max(0, stop - part.span.start)
            tensor = torch.cat([tensor, tensor.new_zeros(pad)], dim=part.dim)
        return tensor


def _load_parameters(hf: Any, reader: CheckpointReader, device: torch.device) -> None:
    """Give every meta parameter its storage from the checkpoint; a tied parameter is read once, under any
    of its names, and stays shared. Persistent buffers the checkpoint holds are read too."""
    owners: dict[int, list[tuple[nn.Module, str, str]]] = {}  # id(parameter) -> (module, attribute, name)
    params: dict[int, tuple[nn.Parameter, Slice | None]] = {}
    for module_name, module in hf.named_modules():
        slices = getattr(module, "tp_slices", {})
        for attr, param in module._parameters.items():
            if param is None:
                continue
            name = f"{module_name}.{attr}" if module_name else attr
            owners.setdefault(id(param), []).append((module, attr, name))
            params.setdefault(id(param), (param, slices.get(attr)))
    missing = []
    for key, (param, part) in params.items():
        names = [name for _, _, name in owners[key] if name in reader]
        if not names:
            missing.append(owners[key][0][2])
            continue
        tensor = reader.read(names[0], part)
        if tensor.shape != param.shape:
            raise ValueError(
                f"{names[0]}: checkpoint slice shape {tuple(tensor.shape)} != {tuple(param.shape)}"
            )
        loaded = nn.Parameter(tensor.to(device=device, dtype=param.dtype), requires_grad=False)
        for module, attr, _ in owners[key]:
            module._parameters[attr] = loaded
    if missing:
        raise KeyError(
            f"weights missing from {reader.model_dir}: {', '.join(missing[:8])}"
            + (" ..." if len(missing) > 8 else "")
        )
    persistent = set(hf.state_dict(keep_vars=True)) - {n for group in owners.values() for _, _, n in group}
    for name in sorted(persistent & reader.names):
        parent, _, leaf = name.rpartition(".")
        owner = hf.get_submodule(parent)
        owner._buffers[leaf] = reader.read(name, None).to(device=device, dtype=owner._buffers[leaf].dtype)

"""How a parameter is filled from a checkpoint: each parameter carries its own `weight_loader`.

    param.weight_loader(param, source, shard)   copy this rank's part of checkpoint tensor `source` into param

`source` is a lazy view (engine/checkpoint.py's `Checkpoint.slice`, or a torch.Tensor in tests): a loader
indexes only the rows or columns its rank holds, so no rank reads a whole split weight. `shard` names the
part of a fused parameter the tensor fills (q/k/v, gate/up), else None. The parallel layers
(parallel_linear.py, vocab_parallel.py) set their parameters' loaders; any other parameter (norms, a
model's own unsplit modules) is replicated and read whole by `default_weight_loader`.

`load_parameters` is the one loop both model paths use: checkpoint names -> parameters -> loaders.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import torch
from torch import nn

if TYPE_CHECKING:
    from engine.checkpoint import TensorSource


class SliceSource(Protocol):
    """A checkpoint tensor read lazily: safetensors' PySafeSlice, or a torch.Tensor."""

    def __getitem__(self, index: object) -> torch.Tensor: ...


WeightLoader = Callable[[torch.Tensor, SliceSource, "str | None"], None]


def source_shape(source: SliceSource) -> tuple[int, ...]:
    if isinstance(source, torch.Tensor):
        return tuple(source.shape)
    return tuple(source.get_shape())  # type: ignore[attr-defined]


def check_shape(source: SliceSource, expected: tuple[int, ...]) -> None:
    got = source_shape(source)
    if got != expected:
        raise ValueError(f"checkpoint shape {got} != expected {expected}")


def copy_part(target: torch.Tensor, part: torch.Tensor) -> None:
    if part.shape != target.shape:  # a source that lied about its shape
        raise ValueError(f"read a slice of shape {tuple(part.shape)}, expected {tuple(target.shape)}")
    target.copy_(part)


def default_weight_loader(param: torch.Tensor, source: SliceSource, shard: str | None) -> None:
    """A replicated parameter: the whole tensor, on every rank."""
    if shard is not None:
        raise ValueError(f"a replicated parameter has no part {shard!r}")
    check_shape(source, tuple(param.shape))
    copy_part(param.data, source[:])


def set_weight_loader(param: nn.Parameter | None, loader: WeightLoader) -> None:
    if param is not None:
        param.weight_loader = loader  # type: ignore[attr-defined]


def weight_loader_of(param: torch.Tensor) -> WeightLoader:
    loader: WeightLoader = getattr(param, "weight_loader", default_weight_loader)
    return loader


def materialize(model: nn.Module, device: torch.device) -> None:
    """Uninitialised storage on `device` for every parameter still on the meta device, keeping each
    parameter's attributes (its weight loader) and its ties (one object under several names stays one).
    `Module.to_empty` would drop the attributes: it makes new Parameters."""
    made: dict[int, nn.Parameter] = {}
    old: list[nn.Parameter] = []  # kept alive so that no id is reused while the map is in use
    for module in model.modules():
        for attr, param in module._parameters.items():
            if param is None or not param.is_meta:
                continue
            new = made.get(id(param))
            if new is None:
                new = nn.Parameter(torch.empty_like(param, device=device), requires_grad=False)
                new.__dict__.update(param.__dict__)
                made[id(param)] = new
                old.append(param)
            module._parameters[attr] = new


def load_parameters(
    model: nn.Module,
    ckpt: TensorSource,
    place: Callable[[str], tuple[str, str | None] | None],
    parts: Callable[[str], tuple[str | None, ...]] = lambda name: (None,),
) -> set[str]:
    """Fill every parameter of `model` from `ckpt`; returns the checkpoint names used.

    place(checkpoint name) -> (parameter name, part) or None for a tensor the model does not take.
    parts(parameter name) -> the parts it expects (a fused parameter's shards; (None,) for the others).
    A tied parameter (one object under several names) is filled once. Raises KeyError naming what the
    checkpoint lacks, ValueError naming a tensor whose shape does not fit."""
    params = dict(model.named_parameters(remove_duplicate=False))
    wanted: dict[tuple[int, str | None], str] = {}
    for name, param in params.items():
        for part in parts(name):
            wanted.setdefault((id(param), part), name)
    done: set[tuple[int, str | None]] = set()
    used: set[str] = set()
    for name in ckpt.names:
        placed = place(name)
        if placed is None:
            continue
        target, part = placed
        if target not in params:
            raise KeyError(f"checkpoint tensor {ckpt.stored_name(name)!r} has no place in the model")
        param = params[target]
        used.add(name)
        if (id(param), part) in done:  # tied: already read under another name
            continue
        try:
            weight_loader_of(param)(param, ckpt.slice(name), part)
        except ValueError as e:
            raise ValueError(f"{ckpt.stored_name(name)}: {e}") from e
        done.add((id(param), part))
    missing = sorted(f"{n}[{key[1]}]" if key[1] else n for key, n in wanted.items() if key not in done)
    if missing:
        raise KeyError(
            f"weights missing from {ckpt.model_dir}: {', '.join(missing[:8])}"
            + (" ..." if len(missing) > 8 else "")
        )
    return used

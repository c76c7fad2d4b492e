"""Command-line options made from config dataclasses, so that each option's name, type, default, choices
and help are written once, on the config field:

    field `max_num_seqs: int = knob(64, "most sequences in one step")`  ->  `--max-num-seqs INTEGER`
    (default 64, env CONVEYOR_MAX_NUM_SEQS or CONVEYOR_WORKER_MAX_NUM_SEQS)

`bool` fields become `--x/--no-x` flags, `Literal[...]` fields a choice, `X | None` an optional X.
Field metadata may carry "help" and "cli" (the option's name when it differs from the field's).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Collection, Mapping
from typing import Any, Literal, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def opt(*decls: str, **kwargs: Any) -> Callable[[F], F]:
    """click.option with CONVEYOR_<NAME> and CONVEYOR_WORKER_<NAME> environment variables."""
    name = max((d for d in decls if d.startswith("--")), key=len).lstrip("-").split("/")[0]
    env = name.upper().replace("-", "_")
    kwargs.setdefault("show_default", True)
    return click.option(*decls, envvar=[f"CONVEYOR_{env}", f"CONVEYOR_WORKER_{env}"], **kwargs)


def option_name(field: dataclasses.Field[Any]) -> str:
    """The option's name without dashes: metadata "cli", else the field name with dashes."""
    return str(field.metadata.get("cli", field.name.replace("_", "-")))


def param_name(field: dataclasses.Field[Any]) -> str:
    """The keyword click passes the option's value under."""
    return option_name(field).replace("-", "_")


def config_fields(cls: type, exclude: Collection[str] = ()) -> list[dataclasses.Field[Any]]:
    return [f for f in dataclasses.fields(cls) if f.name not in exclude]


def config_options(cls: type, exclude: Collection[str] = ()) -> Callable[[F], F]:
    """A decorator adding one option per field of the dataclass `cls` (in field order)."""
    hints = typing.get_type_hints(cls)
    decorators = [_option(f, hints[f.name]) for f in config_fields(cls, exclude)]

    def apply(command: F) -> F:
        for decorator in reversed(decorators):
            command = decorator(command)
        return command

    return apply


def pop_config_kwargs(cls: type, values: dict[str, Any], exclude: Collection[str] = ()) -> dict[str, Any]:
    """Take the values of `cls`'s options out of click's keyword arguments, keyed by field name. An option
    left at None for a field with a default factory is dropped, so the factory runs."""
    out: dict[str, Any] = {}
    for f in config_fields(cls, exclude):
        value = values.pop(param_name(f))
        if value is None and f.default_factory is not dataclasses.MISSING:
            continue
        out[f.name] = value
    return out


def _option(field: dataclasses.Field[Any], hint: Any) -> Callable[[F], F]:
    name = option_name(field)
    kind, optional = _unwrap_optional(hint)
    kwargs: dict[str, Any] = {"help": field.metadata.get("help")}
    if field.default is not dataclasses.MISSING:
        kwargs["default"] = field.default
    elif field.default_factory is not dataclasses.MISSING:
        kwargs["default"] = None  # the factory runs when the dataclass is built (pop_config_kwargs)
    else:
        kwargs["required"] = True
    if kind is bool and not optional:
        return opt(f"--{name}/--no-{name}", **kwargs)
    if typing.get_origin(kind) is Literal:
        kwargs["type"] = click.Choice([str(c) for c in typing.get_args(kind)])
    elif kind in (int, float, str):
        kwargs["type"] = kind
    else:
        raise TypeError(f"no command-line option type for {field.name}: {hint!r}")
    return opt(f"--{name}", **kwargs)


def _unwrap_optional(hint: Any) -> tuple[Any, bool]:
    """(X, True) for `X | None`, (hint, False) otherwise."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(hint)) == 2:
            return args[0], True
    return hint, False


def config_defaults(cls: type) -> Mapping[str, Any]:
    """Field name -> default, for fields that have a plain default."""
    return {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}

"""Command-line options made from config classes, so that each option's name, type, default, choices and
help are written once, on the config field:

    field `max_num_seqs: int = knob(64, "most sequences in one step")`  ->  `--max-num-seqs INTEGER`
    (default 64, env CONVEYOR_MAX_NUM_SEQS or CONVEYOR_WORKER_MAX_NUM_SEQS)

The classes are frozen dataclasses (fields made with engine.config.knob: metadata "help", "cli" (the
option's name when it differs from the field's), "min") or pydantic models (GatewaySettings: the help is
the field's description, "cli" in its json_schema_extra, the range from its ge/gt/lt/le constraints).
`bool` fields become `--x/--no-x` flags, `Literal[...]` fields a choice, `X | None` an optional X.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Collection, Mapping
from typing import Any, Literal, TypeVar

import annotated_types
import click
from pydantic import BaseModel

F = TypeVar("F", bound=Callable[..., Any])


def opt(*decls: str, **kwargs: Any) -> Callable[[F], F]:
    """click.option with CONVEYOR_<NAME> and CONVEYOR_WORKER_<NAME> environment variables."""
    name = max((d for d in decls if d.startswith("--")), key=len).lstrip("-").split("/")[0]
    env = name.upper().replace("-", "_")
    kwargs.setdefault("show_default", True)
    return click.option(*decls, envvar=[f"CONVEYOR_{env}", f"CONVEYOR_WORKER_{env}"], **kwargs)


@dataclasses.dataclass(frozen=True)
class OptionField:
    """One config field as an option sees it, whichever kind of class it comes from."""

    name: str  # the field's
    hint: Any
    default: Any  # dataclasses.MISSING: required
    has_factory: bool  # the default comes from a factory when the class is built
    help: str | None
    cli: str | None
    min: float | None = None
    min_open: bool = False  # gt rather than ge
    max: float | None = None
    max_open: bool = False


def option_name(field: dataclasses.Field[Any] | OptionField) -> str:
    """The option's name without dashes: metadata "cli", else the field name with dashes."""
    cli = field.cli if isinstance(field, OptionField) else field.metadata.get("cli")
    return str(cli or field.name.replace("_", "-"))


def param_name(field: dataclasses.Field[Any] | OptionField) -> str:
    """The keyword click passes the option's value under."""
    return option_name(field).replace("-", "_")


def config_fields(cls: type, exclude: Collection[str] = ()) -> list[OptionField]:
    fields = _pydantic_fields(cls) if issubclass(cls, BaseModel) else _dataclass_fields(cls)
    return [f for f in fields if f.name not in exclude]


def _dataclass_fields(cls: type) -> list[OptionField]:
    hints = typing.get_type_hints(cls)
    return [
        OptionField(
            f.name,
            hints[f.name],
            f.default,
            f.default_factory is not dataclasses.MISSING,
            f.metadata.get("help"),
            f.metadata.get("cli"),
            f.metadata.get("min"),
        )
        for f in dataclasses.fields(cls)
    ]


def _pydantic_fields(cls: type[BaseModel]) -> list[OptionField]:
    out = []
    for name, info in cls.model_fields.items():
        bounds: dict[str, Any] = {}
        for c in info.metadata:
            if isinstance(c, annotated_types.Ge):
                bounds.update(min=c.ge)
            elif isinstance(c, annotated_types.Gt):
                bounds.update(min=c.gt, min_open=True)
            elif isinstance(c, annotated_types.Le):
                bounds.update(max=c.le)
            elif isinstance(c, annotated_types.Lt):
                bounds.update(max=c.lt, max_open=True)
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        has_factory = info.default_factory is not None
        default = dataclasses.MISSING if info.is_required() else None if has_factory else info.default
        cli = extra.get("cli")
        out.append(
            OptionField(
                name,
                info.annotation,
                default,
                has_factory,
                info.description,
                str(cli) if cli else None,
                **bounds,
            )
        )
    return out


def config_options(
    cls: type, exclude: Collection[str] = (), callbacks: Mapping[str, Callable[..., Any]] | None = None
) -> Callable[[F], F]:
    """A decorator adding one option per field of the config class `cls` (in field order). callbacks:
    field name -> click callback (a check that fails with exit code 2 before the command runs)."""
    decorators = [_option(f, (callbacks or {}).get(f.name)) for f in config_fields(cls, exclude)]

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
        if value is None and f.has_factory:
            continue
        out[f.name] = value
    return out


def _option(field: OptionField, callback: Callable[..., Any] | None) -> Callable[[F], F]:
    name = option_name(field)
    kind, optional = _unwrap_optional(field.hint)
    kwargs: dict[str, Any] = {"help": field.help}
    if callback is not None:
        kwargs["callback"] = callback
    if field.has_factory:
        kwargs["default"] = None  # the factory runs when the class is built (pop_config_kwargs)
    elif field.default is not dataclasses.MISSING:
        kwargs["default"] = field.default
    else:
        kwargs["required"] = True
    if kind is bool and not optional:
        return opt(f"--{name}/--no-{name}", **kwargs)
    if typing.get_origin(kind) is Literal:
        kwargs["type"] = click.Choice([str(c) for c in typing.get_args(kind)])
    elif kind in (int, float) and (field.min is not None or field.max is not None):
        kwargs["type"] = _range(kind, field)
    elif kind in (int, float, str):
        kwargs["type"] = kind
    else:
        raise TypeError(f"no command-line option type for {field.name}: {field.hint!r}")
    return opt(f"--{name}", **kwargs)


def _range(kind: type, f: OptionField) -> click.ParamType:
    if kind is int:  # whole numbers: an open bound is the next one in
        low = None if f.min is None else int(f.min) + (1 if f.min_open else 0)
        high = None if f.max is None else int(f.max) - (1 if f.max_open else 0)
        return click.IntRange(low, high)
    return click.FloatRange(f.min, f.max, min_open=f.min_open, max_open=f.max_open)


def _unwrap_optional(hint: Any) -> tuple[Any, bool]:
    """(X, True) for `X | None`, (hint, False) otherwise."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(hint)) == 2:
            return args[0], True
    return hint, False


def config_defaults(cls: type) -> Mapping[str, Any]:
    """Field name -> default, for fields that have a plain default."""
    return {
        f.name: f.default
        for f in config_fields(cls)
        if not f.has_factory and f.default is not dataclasses.MISSING
    }

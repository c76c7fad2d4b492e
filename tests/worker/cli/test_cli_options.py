"""`conveyor worker`'s engine and worker options are made from the config dataclasses: one option per
field, with the field's default, choices and help, and the values reach the configs built from them."""

from __future__ import annotations

import dataclasses
import typing

import click
import pytest
from click.testing import CliRunner

from engine.config import EngineConfig, literal_choices
from worker.cli.main import WORKER_FIELDS_NOT_OPTIONS, main
from worker.cli.options import option_name
from worker.config import WorkerConfig
from worker.intake.limits import Limits
from worker.keys import Keys

OPTIONS = {p.name: p for p in main.commands["worker"].params if isinstance(p, click.Option)}


def _option(field: dataclasses.Field) -> click.Option:
    opt = OPTIONS.get(option_name(field).replace("-", "_"))
    assert opt is not None, f"no --{option_name(field)} option for {field.name}"
    return opt


def _fields(cls, exclude=()):
    return [f for f in dataclasses.fields(cls) if f.name not in exclude]


@pytest.mark.parametrize("field", _fields(EngineConfig), ids=lambda f: f.name)
def test_every_engine_field_is_an_option_with_its_default_choices_and_help(field):
    opt = _option(field)
    if field.default is dataclasses.MISSING:
        assert opt.required
    else:
        assert opt.default == field.default
    assert opt.help and opt.help == field.metadata["help"]
    choices = literal_choices(EngineConfig, field.name)
    if choices is not None:
        assert list(opt.type.choices) == list(choices)
    if typing.get_type_hints(EngineConfig)[field.name] is bool:
        assert opt.is_bool_flag and opt.secondary_opts == [f"--no-{option_name(field)}"]


@pytest.mark.parametrize(
    "field",
    _fields(WorkerConfig, WORKER_FIELDS_NOT_OPTIONS) + _fields(Limits) + _fields(Keys),
    ids=lambda f: f.name,
)
def test_every_worker_field_is_an_option_with_its_default(field):
    opt = _option(field)
    expected = None if field.default is dataclasses.MISSING else field.default  # None: the factory runs
    assert opt.default == expected and opt.help == field.metadata["help"]


class _Built(Exception):
    pass


def test_option_values_reach_the_worker_and_engine_configs(monkeypatch):
    import engine
    import worker.cli.main
    import worker.run.build

    monkeypatch.setattr(engine, "LLMEngine", lambda model, **kw: ("engine", model, kw), raising=False)
    import worker.cli.preflight

    monkeypatch.setattr(worker.cli.main, "_client", lambda kw: None)
    # No Redis here: the start-up checks (tested in test_cli.py) are not what this test is about.
    monkeypatch.setattr(worker.cli.preflight, "wait_reachable", lambda client, url: None)
    monkeypatch.setattr(worker.cli.preflight, "check_eviction_policy", lambda client, allow: None)
    monkeypatch.setattr(worker.cli.preflight, "check_permissions", lambda client, cfg: None)
    monkeypatch.setattr(worker.cli.preflight, "check_lane_layout", lambda client, keys, layout: None)

    def built(engine, client, cfg, *layout, **hooks):
        raise _Built(engine, cfg)

    monkeypatch.setattr(worker.run.build, "build", built)
    args = ["worker", "--model", "/m", "--max-prompt-tokens", "77", "--drain-timeout", "2.5"]
    args += ["--max-tokens-limit", "9", "--block-ms", "50", "--group", "g", "--stream", "in"]
    result = CliRunner().invoke(main, args, env={"CONVEYOR_DEAD_MAXLEN": "123"})
    assert isinstance(result.exception, _Built), result.output
    (_, model, engine_kw), cfg = result.exception.args
    assert model == "/m" and engine_kw["max_prompt_tokens"] == 77
    assert EngineConfig(model=model, **engine_kw) == EngineConfig(model="/m", max_prompt_tokens=77)
    assert cfg.drain_timeout_s == 2.5 and cfg.block_ms == 50 and cfg.dead_maxlen == 123
    assert cfg.limits == Limits(max_tokens=9) and cfg.group == "g"
    assert cfg.keys == Keys(requests_stream="in") and cfg.keys.requests == "in"
    assert cfg.consumer  # left unset: the default factory (<host>-<pid>) ran


@pytest.mark.parametrize("command", ["make-tiny-model", "demo"])
def test_arch_choices_are_the_registrys(command):
    from engine.models.registry import TINY_ARCHS

    (arch,) = [p for p in main.commands[command].params if p.name == "arch"]
    assert list(arch.type.choices) == list(TINY_ARCHS)  # the native families and the generic ones

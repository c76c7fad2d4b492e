"""`conveyor serve`'s options are made from GatewaySettings, RedisSettings and BatchApiConfig as the
worker's are from its configs; no command restates a default its config already holds."""

from __future__ import annotations

import dataclasses

import click
import pytest
from click.testing import CliRunner

from engine.config import EngineConfig, SchedulerConfig
from worker.batch.api_config import BatchApiConfig
from worker.cli.main import GATEWAY_FIELDS_NOT_OPTIONS, main
from worker.cli.options import config_fields, option_name
from worker.config import WorkerConfig
from worker.gateway.settings import GatewaySettings
from worker.intake.limits import Limits
from worker.keys import Keys
from worker.redis_settings import RedisSettings


def _options(command: str) -> dict[str, click.Option]:
    return {p.name: p for p in main.commands[command].params if isinstance(p, click.Option) and p.name}


@pytest.mark.parametrize(
    "field", config_fields(GatewaySettings, GATEWAY_FIELDS_NOT_OPTIONS), ids=lambda f: f.name
)
def test_every_gateway_field_is_a_serve_option_with_its_default_and_help(field):
    opt = _options("serve").get(option_name(field).replace("-", "_"))
    assert opt is not None, f"no --{option_name(field)} option for {field.name}"
    assert opt.default == field.default and opt.help == field.help


def test_serve_option_values_reach_the_gateway_settings(monkeypatch):
    import worker.gateway.serve

    seen = {}
    monkeypatch.setattr(
        worker.gateway.serve, "run", lambda settings, level: seen.update(s=settings, level=level)
    )
    args = ["serve", "--request-timeout", "5", "--port", "9000", "--shards", "3", "--api-key", "t=k"]
    args += ["--batch-drivers", "2", "--redis-url", "redis://h:1/0", "--redis-socket-timeout", "2"]
    result = CliRunner().invoke(main, args, env={"CONVEYOR_MAX_QUEUED": "7", "CONVEYOR_LOG_LEVEL": "warning"})
    assert result.exit_code == 0, result.output
    s = seen["s"]
    assert (s.request_timeout_s, s.port, s.shards, s.max_queued) == (5.0, 9000, 3, 7)
    assert s.api_keys == {"k": "t"} and s.batches == BatchApiConfig(max_batches=2)
    assert (s.redis_url, s.redis_socket_timeout) == ("redis://h:1/0", 2.0) and seen["level"] == "warning"
    assert s.host == "127.0.0.1" and s.retry_after_s == GatewaySettings().retry_after_s  # left to defaults


def test_the_settings_constraints_are_the_options_ranges():
    options = _options("serve")
    port, shards, timeout = options["port"].type, options["shards"].type, options["request_timeout"].type
    assert isinstance(port, click.IntRange) and (port.min, port.max) == (0, 65535)  # lt=65536
    assert isinstance(shards, click.IntRange) and (shards.min, shards.max) == (1, None)
    assert isinstance(timeout, click.FloatRange) and (timeout.min, timeout.min_open) == (0, True)  # gt=0
    result = CliRunner().invoke(main, ["serve", "--port", "70000"])
    assert result.exit_code == 2 and "is not in the range 0<=x<=65535" in result.output


# Each command and the config classes its options come from; `plan` sizes a concrete dtype and
# quantization, so those two defaults are its own (`demo` has its own --redis-url: one it may start).
SOURCES = {
    "serve": (GatewaySettings, RedisSettings, BatchApiConfig),
    "worker": (EngineConfig, WorkerConfig, Limits, Keys, RedisSettings),
    "plan": (EngineConfig,),
    "submit": (RedisSettings, Keys),
    "batch": (RedisSettings, Keys),
}
OWN_DEFAULTS = {("plan", "dtype"), ("plan", "quantization")}


@pytest.mark.parametrize("command", SOURCES)
def test_no_command_states_a_default_other_than_its_configs(command):
    """An option named as a config field has that field's default: a hand-written option restating a
    default fails here as soon as the two differ."""
    options = _options(command)
    checked = 0
    for cls in SOURCES[command]:
        for field in config_fields(cls):
            opt = options.get(option_name(field).replace("-", "_"))
            required = field.default is dataclasses.MISSING
            if opt is None or (command, field.name) in OWN_DEFAULTS or field.has_factory or required:
                continue
            assert opt.default == field.default, f"{command} --{option_name(field)}: {opt.default!r}"
            checked += 1
    assert checked


def test_the_scheduler_config_takes_the_engines_defaults():
    engine = {f.name: f.default for f in dataclasses.fields(EngineConfig)}
    scheduler = SchedulerConfig(num_blocks=1)
    for name in (
        "block_size",
        "max_num_seqs",
        "max_num_batched_tokens",
        "enable_prefix_caching",
        "scheduling",
    ):
        assert getattr(scheduler, name) == engine[name]
    assert scheduler.policy == engine["scheduling_policy"]

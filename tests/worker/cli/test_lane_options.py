"""`conveyor worker --priority-lanes` / `--tenant-weight` (cli/lane_options.py): refused combinations and
bad values are usage errors before Redis or the model; a worker started with lanes (from the environment)
writes the layout, lists its lanes in the registry, and serves jobs that `conveyor submit` puts in them;
a worker without lanes warns about a layout left in Redis (cli/preflight.py)."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner
from structlog.testing import capture_logs

from tests.helpers.waiting import wait_until
from tests.helpers.worker_fakes import log_lines, spawn_worker
from worker.cli.main import main
from worker.cli.preflight import check_lane_layout
from worker.fleet import registry
from worker.intake.lane_layout import priority_layout, tenant_layout, write_layout
from worker.keys import Keys

NOWHERE = ["worker", "--model", "/m", "--redis-url", "redis://127.0.0.1:1/0"]


@pytest.mark.parametrize(
    "extra, says",
    [
        (["--priority-lanes", "0,10", "--tenant-weight", "a=2"], "cannot be combined"),
        (["--priority-lanes", "0,10", "--cluster"], "cannot be combined with --cluster or --shards"),
        (["--tenant-weight", "a=2", "--shards", "4"], "cannot be combined with --cluster or --shards"),
        (["--priority-lanes", "5"], "at least two distinct levels"),
        (["--tenant-weight", "a=0"], "must be > 0"),
        (["--tenant-weight", "default=2"], "at least one tenant besides 'default'"),
    ],
)
def test_combinations_the_worker_does_not_run_are_refused_before_redis(extra, says):
    result = CliRunner().invoke(main, [*NOWHERE, *extra])
    assert result.exit_code == 2 and says in result.output, result.output


def test_tenant_weights_from_the_environment_are_split_on_spaces():
    result = CliRunner().invoke(main, NOWHERE, env={"CONVEYOR_TENANT_WEIGHT": "a=2 b=0"})
    assert result.exit_code == 2 and "weight in 'b=0' must be > 0" in result.output, result.output


@pytest.mark.redis
@pytest.mark.timeout(120)
def test_a_worker_with_priority_lanes_serves_what_submit_puts_in_them(redis_server, r, tiny_model, tmp_path):
    os.environ["CONVEYOR_PRIORITY_LANES"] = "0,10"
    try:
        proc = spawn_worker(redis_server.url, tiny_model, "lanes", tmp_path / "w.log")
    finally:
        del os.environ["CONVEYOR_PRIORITY_LANES"]
    try:
        keys = Keys()
        wait_until(lambda: r.exists(keys.lane_layout), 60, "the worker's lane layout")
        wait_until(lambda: registry.live(registry.read(r, keys)), 30, "the worker in the registry")
        assert json.loads(r.get(keys.lane_layout))["streams"] == [
            "conveyor:requests",
            "conveyor:requests:p10",
        ]
        args = ["submit", "hi", "--redis-url", redis_server.url, "--max-tokens", "3", "--id", "bulk"]
        result = CliRunner().invoke(main, [*args, "--priority", "10"])
        assert result.exit_code == 0, result.output
        assert r.xlen("conveyor:requests:p10") == 1 and r.xlen("conveyor:requests") == 0
        (record,) = registry.live(registry.read(r, keys))
        assert record.streams == ["conveyor:requests", "conveyor:requests:p10"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert not [line for line in log_lines(tmp_path / "w.log") if line.get("level") == "error"]


@pytest.mark.redis
def test_a_layout_that_is_not_the_workers_own_is_warned_about(r):
    keys = Keys()
    with capture_logs() as logs:
        check_lane_layout(r, keys, None)  # no layout in Redis, none wanted: silence
        write_layout(r, keys, priority_layout(keys, [0, 10]))
        check_lane_layout(r, keys, priority_layout(keys, [0, 10]))  # the same: silence
        check_lane_layout(r, keys, None)
        check_lane_layout(r, keys, tenant_layout(keys, ["a"]))
    warned = [e["event"] for e in logs]
    assert len(warned) == 2, warned
    assert warned[0].startswith("clients add jobs to lane streams this worker does not read")
    assert warned[1].startswith("replacing another lane layout")

"""A worker under exactly the ACL of docs/operations.md (worker/acl.py's list): it serves, cancels, takes
over and trims; a user missing commands is refused at start in one line; a refusal at run time ends the
worker cleanly with its unacknowledged count as XPENDING has it."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import redis
import structlog
from click.testing import CliRunner

from tests.helpers.worker_fakes import FakeEngine, on_a_thread, wait_until
from worker import local_redis
from worker.acl import WORKER_COMMANDS, acl_rule, missing_commands
from worker.cli.main import main
from worker.client import collect, enqueue
from worker.config import WorkerConfig
from worker.connection import connect
from worker.keys import Keys
from worker.run.loop import Worker

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]
K = Keys()
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def server():
    if local_redis.redis_server_path() is None:
        pytest.skip("redis-server is not installed")
    started = local_redis.start()
    yield started
    started.stop()


@pytest.fixture
def admin(server):
    client = redis.Redis(port=server.port)
    client.flushall()
    client.acl_log_reset()
    return client


def user_url(admin: redis.Redis, server, name: str, without: tuple[str, ...] = ()) -> str:
    """An ACL user granted the documented rule, less the commands in `without`."""
    rule = acl_rule(user=name, password="pw").split()[3:]  # after "ACL SETUSER <name>"
    admin.execute_command("ACL", "SETUSER", name, "reset", *[r for r in rule if r[1:] not in without])
    return f"redis://{name}:pw@127.0.0.1:{server.port}/0"


def test_the_documented_rule_is_the_list_in_code():
    assert acl_rule() in (ROOT / "docs" / "operations.md").read_text()


def test_a_worker_under_exactly_the_documented_acl_serves_cancels_takes_over_and_trims(server, admin):
    url = user_url(admin, server, "conveyor")
    cfg = WorkerConfig(group="test", consumer="w1", lease_ms=300)
    assert missing_commands(connect(url), cfg) == []
    # A job left pending under a dead consumer, to be taken over once its lease lapsed.
    admin.xgroup_create(K.requests, "test", id="0", mkstream=True)
    enqueue(admin, {"id": "orphan", "prompt": "o", "max_tokens": 3})
    admin.xreadgroup("test", "dead", {K.requests: ">"})
    engine = FakeEngine(step_s=0.01)
    worker = Worker(engine, connect(url), cfg)
    worker.lanes[0].trimmer.every_s = 0.2  # trim often (default: every minute)
    client = admin  # clients are another user; this one is the worker's
    with on_a_thread(worker):
        enqueue(client, {"id": "a", "prompt": "x", "max_tokens": 3})
        assert collect(client, "a", timeout_s=10)[-1]["type"] == "done"
        enqueue(client, {"id": "long", "prompt": "y", "max_tokens": 400})
        wait_until(lambda: client.xlen(K.out("long")) >= 2, 10, "tokens of the long job")
        client.publish(K.cancel_channel, "long")
        done = collect(client, "long", timeout_s=10)[-1]
        assert done["finish_reason"] == "abort" and done["reason"] == "cancel"
        assert collect(client, "orphan", timeout_s=10)[-1]["type"] == "done"
        wait_until(lambda: admin.xlen(K.requests) == 0, 10, "the requests stream to be trimmed")
    assert admin.acl_log() == [], "a command was refused"


def test_a_user_missing_commands_is_refused_at_start_in_one_line(server, admin, monkeypatch):
    import engine

    loaded = []
    monkeypatch.setattr(engine, "LLMEngine", lambda *a, **k: loaded.append(a), raising=False)
    url = user_url(admin, server, "partial", without=("exec", "hmget", "xautoclaim"))
    result = CliRunner().invoke(main, ["worker", "--model", "/nowhere", "--redis-url", url])
    assert result.exit_code == 1 and loaded == []
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert "may not run exec xautoclaim hmget on conveyor:*" in lines[0]


@pytest.mark.parametrize("dropped", [c for c in WORKER_COMMANDS if c not in ("config|get",)])
def test_the_check_names_each_missing_command(server, admin, dropped):
    url = user_url(admin, server, "partial", without=(dropped,))
    assert missing_commands(connect(url), WorkerConfig(group="test")) == [dropped]
    assert admin.keys("*") == [], "the probe wrote nothing"


def test_a_refusal_at_run_time_is_one_line_and_a_clean_stop(server, admin):
    url = user_url(admin, server, "nomulti", without=("multi",))
    worker = Worker(FakeEngine(), connect(url), WorkerConfig(group="test", consumer="w1"))
    failures: list[BaseException] = []

    def run() -> None:
        try:
            worker.run()
        except BaseException as exc:
            failures.append(exc)

    with structlog.testing.capture_logs() as logs:
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        enqueue(admin, {"id": "j", "prompt": "x", "max_tokens": 3})
        thread.join(timeout=20)
    assert not thread.is_alive() and failures == []
    assert worker.refused is not None and "multi" in worker.refused
    errors = [e for e in logs if e["log_level"] == "error"]
    assert len(errors) == 1 and errors[0]["event"].startswith("redis refused a command")
    pending = admin.xpending(K.requests, "test")["pending"]
    stopped = [e for e in logs if e["event"] == "worker stopped"]
    assert pending == 1 and stopped[0]["left_unacknowledged"] == pending


def test_a_refused_cancel_channel_is_one_line_and_jobs_still_run(server, admin):
    url = user_url(admin, server, "nosub", without=("subscribe",))
    worker = Worker(FakeEngine(), connect(url), WorkerConfig(group="test", consumer="w1"))
    with structlog.testing.capture_logs() as logs, on_a_thread(worker):
        enqueue(admin, {"id": "j", "prompt": "x", "max_tokens": 3})
        assert collect(admin, "j", timeout_s=10)[-1]["type"] == "done"
        wait_until(lambda: any(e["log_level"] == "error" for e in logs), 10, "the refusal")
    errors = [e for e in logs if e["log_level"] == "error"]
    assert [e["event"] for e in errors] == ["cancel channel refused (ACL): cancels by key only"]

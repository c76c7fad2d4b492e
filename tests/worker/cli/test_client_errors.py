"""Issue 20, item 4: `conveyor submit`, `conveyor batch` and worker.client fail with one line, no traceback,
for a refused port, a server that never answers, bad credentials, no worker and Redis lost mid-follow;
--timeout (and events' timeout_s) bounds the whole call, connecting included. The bounds are checked by
pytest-timeout: each call here is given a few seconds against a 30 s socket timeout."""

from __future__ import annotations

import json
import socket
import threading

import pytest
import redis
from click.testing import CliRunner

from tests.helpers.fault_proxy import FaultProxy
from tests.helpers.worker_fakes import FakeEngine, running_worker, wait_until
from worker import local_redis
from worker.cli.main import main
from worker.client import NoAnswer, enqueue, events
from worker.connection import connect
from worker.keys import Keys

pytestmark = [pytest.mark.redis, pytest.mark.timeout(20)]
K = Keys()


@pytest.fixture
def silent_url():
    """A bare TCP listener: connections are accepted (by the kernel) and never answered."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        yield f"redis://127.0.0.1:{listener.getsockname()[1]}/0"


def refused_url() -> str:
    return f"redis://127.0.0.1:{local_redis.free_port()}/0"


def assert_one_line(result, *wanted: str) -> None:
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit), f"a traceback: {result.exception!r}"
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert "Traceback" not in result.output
    for text in wanted:
        assert text in lines[0], lines[0]


def submit(url: str, *extra: str):
    return CliRunner().invoke(main, ["submit", "hi", "--redis-url", url, "--timeout", "2", *extra])


def batch(url: str, tmp_path, *extra: str):
    lines = [
        {"custom_id": f"c{k}", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}}
        for k in range(2)
    ]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    args = ["batch", "-i", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "out.jsonl")]
    return CliRunner().invoke(main, [*args, "--redis-url", url, "--timeout", "2", *extra])


@pytest.mark.parametrize("command", ["submit", "batch"])
def test_a_refused_port(command, tmp_path):
    result = submit(refused_url()) if command == "submit" else batch(refused_url(), tmp_path)
    assert_one_line(result, "cannot reach Redis at redis://127.0.0.1:", "Connection refused")


@pytest.mark.parametrize("command", ["submit", "batch"])
def test_a_server_that_never_answers_is_bounded_by_the_timeout(command, silent_url, tmp_path):
    result = submit(silent_url) if command == "submit" else batch(silent_url, tmp_path)
    assert_one_line(result, "did not answer in time")


@pytest.mark.parametrize("command", ["submit", "batch"])
def test_bad_credentials(command, own_server, tmp_path):
    server = own_server(password="right")
    url = f"redis://:wrong@127.0.0.1:{server.port}/0"
    result = submit(url) if command == "submit" else batch(url, tmp_path)
    assert_one_line(result, "refused the credentials", ":***@")


@pytest.mark.parametrize("command", ["submit", "batch"])
def test_no_worker(command, own_server, tmp_path):
    """No live worker reads the stream: said at once, nothing queued; --wait queues and waits --timeout."""
    url = own_server().url
    result = submit(url) if command == "submit" else batch(url, tmp_path)
    assert_one_line(result, "no live worker reads conveyor:requests", "--wait")
    assert connect(url).xlen(K.requests) == 0
    result = submit(url, "--wait") if command == "submit" else batch(url, tmp_path, "--wait")
    assert_one_line(result, "within 2s: is a worker serving this queue?")


@pytest.mark.parametrize("command", ["submit", "batch"])
def test_redis_lost_mid_follow(command, own_server, tmp_path):
    server = own_server()
    with running_worker(FakeEngine(step_s=0.05), server.url, served="tiny", drain_timeout_s=0.5):
        results = []
        run = (
            (lambda: results.append(submit(server.url, "--max-tokens", "400", "--id", "lost")))
            if command == "submit"
            else (lambda: results.append(batch(server.url, tmp_path)))
        )
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        direct = connect(server.url)
        wait_until(lambda: direct.xlen(K.requests) >= 1, 10, "the job")
        server.stop()
        thread.join(timeout=15)
    assert not thread.is_alive()
    assert_one_line(results[0], "Redis unreachable" if command == "submit" else "cannot reach Redis")


def test_events_on_a_default_client_is_bounded_by_its_timeout(own_server):
    """redis-py's default client retries a timed-out read 3 times (5 s each): 20 s and more for one call."""
    server = own_server()
    with FaultProxy(server.port) as proxy:
        client = redis.Redis(port=proxy.port)
        enqueue(client, {"id": "quiet", "prompt": "x"})
        proxy.set("stall")
        with pytest.raises(NoAnswer, match="no terminal event for quiet within 2s: Redis unreachable"):
            list(events(client, "quiet", timeout_s=2))


@pytest.mark.timeout(60)
def test_events_on_a_default_client_reads_on_through_a_stall_longer_than_its_socket_timeout(own_server):
    server = own_server()
    engine = FakeEngine(step_s=0.05)
    with FaultProxy(server.port) as proxy, running_worker(engine, server.url):
        client = redis.Redis(port=proxy.port)  # redis-py's defaults: 5 s socket timeout, 3 retries
        enqueue(client, {"id": "through", "prompt": "p", "max_tokens": 200})
        got: list[dict] = []
        reader = threading.Thread(target=lambda: got.extend(events(client, "through", timeout_s=40)))
        reader.start()
        wait_until(lambda: len(got) >= 5, 10, "the first events")
        proxy.set("stall")
        threading.Event().wait(6.0)  # longer than the 5 s socket timeout
        proxy.set("pass")
        reader.join(timeout=40)
    assert got[-1]["type"] == "done" and got[-1]["text"] == engine.expected_text("p", 200)
    assert [e["index"] for e in got if e["type"] == "token"] == list(range(200)), "read on from the last id"

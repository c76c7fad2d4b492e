"""Two workers with default options on one host both serve; an explicit port that is taken stops the
worker before its model loads; the metrics listener binds loopback unless told otherwise."""

from __future__ import annotations

import os
import socket
import urllib.request

import pytest
from click.testing import CliRunner

from tests.helpers.rel_helpers import Workers, enqueue_many, wait_terminal
from worker.cli import metrics_listener
from worker.cli.main import main
from worker.connection import connect
from worker.keys import Keys


def _listening_hosts(port: int) -> set[str]:
    """The local addresses a socket listens on at `port`, from /proc/net/tcp (IPv4, Linux)."""
    hosts = set()
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, port_hex = local.split(":")
        if state == "0A" and int(port_hex, 16) == port:  # 0A: LISTEN
            hosts.add(socket.inet_ntoa(bytes.fromhex(address)[::-1]))
    return hosts


def _served_port(worker) -> int:
    served = [line for line in worker.lines() if line.get("event") == "metrics served"]
    assert served, worker.log.read_text()[-2000:]
    return int(served[0]["port"])


@pytest.mark.redis
@pytest.mark.timeout(180)
@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="reads listening sockets from /proc")
def test_two_workers_with_default_options_on_one_host_both_serve(redis_server, tiny_model, tmp_path):
    pool = Workers(tiny_model, tmp_path)
    try:
        first = pool.spawn(redis_server.url, "m1", group="test", metrics_port=None)
        first.wait_started()
        second = pool.spawn(redis_server.url, "m2", group="test", metrics_port=None)
        second.wait_started()
        r = connect(redis_server.url)
        jobs = [{"id": f"mp{k}", "prompt": "hello", "max_tokens": 3} for k in range(6)]
        enqueue_many(r, jobs, Keys())
        ends = wait_terminal(r, [j["id"] for j in jobs], 60)
        assert all(events[-1]["type"] == "done" for events in ends.values())
        assert first.alive() and second.alive(), second.log.read_text()[-2000:]
        ports = {_served_port(first), _served_port(second)}
        assert len(ports) == 2  # the second took the next free port, and said so
        for port in ports:
            body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
            assert b"conveyor_queue_depth" in body
            assert _listening_hosts(port) == {"127.0.0.1"}  # loopback by default
    finally:
        pool.stop_all()


@pytest.fixture
def no_engine(monkeypatch):
    import engine

    def fake_engine(model, **kw):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(engine, "LLMEngine", fake_engine, raising=False)


def test_an_explicit_port_that_is_taken_stops_the_worker_before_the_model_loads(no_engine):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = CliRunner().invoke(main, ["worker", "--model", "/nowhere", "--metrics-port", str(port)])
    assert result.exit_code == 1 and not isinstance(result.exception, AssertionError)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and f"--metrics-port {port}" in lines[0], result.output
    assert "Traceback" not in result.output


def test_a_taken_default_port_gives_way_to_the_next_one():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        listener = metrics_listener.bind_metrics("127.0.0.1", port, explicit=False)
        assert listener is not None and listener.port != port
        listener.close()
        with pytest.raises(metrics_listener.PortTaken, match="--metrics-port"):
            metrics_listener.bind_metrics("127.0.0.1", port, explicit=True)

"""Issue 43 row 6: the clients route by model as the gateway does, say at once when no live worker
would take their jobs, and `conveyor top` shows jobs waiting where nobody reads."""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner

from tests.helpers.worker_fakes import spawn_worker, wait_until
from worker.cli.main import main
from worker.fleet import registry
from worker.fleet.read_fleet import take
from worker.fleet.top_view import render
from worker.keys import Keys

pytestmark = [pytest.mark.redis, pytest.mark.timeout(180)]
K = Keys()


def _line(custom_id: str, model: str | None) -> str:
    body = {"prompt": "Once upon a time", "max_tokens": 3, **({"model": model} if model else {})}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/completions", "body": body})


def _one_line_error(result, *wanted: str) -> None:
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    for text in wanted:
        assert text in lines[0], lines[0]


@pytest.fixture
def tiny_worker(redis_server, r, tiny_model, tmp_path):
    """`conveyor worker --served-model-name tiny`, as the README's HTTP section starts it."""
    r.flushall()
    proc = spawn_worker(
        redis_server.url, tiny_model, "tiny1", tmp_path / "w.log", "--served-model-name", "tiny"
    )
    try:
        wait_until(lambda: registry.live(registry.read(r, K)), 90, "the worker in the registry")
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_submit_and_batch_route_by_model_and_refuse_at_once_where_no_worker_reads(
    redis_server, r, tiny_worker, tmp_path
):
    url = ["--redis-url", redis_server.url]
    start = time.monotonic()
    result = CliRunner().invoke(main, ["submit", "Once upon a time", *url])
    _one_line_error(result, "no live worker reads conveyor:requests", "tiny", "--model")
    result = CliRunner().invoke(main, ["submit", "Once upon a time", "--model", "other", *url])
    _one_line_error(result, "no live worker serves model 'other'", "tiny")
    assert time.monotonic() - start < 5, "said at once, not after a timeout"
    assert not r.exists(K.requests) and not r.exists("conveyor:requests:other"), "nothing queued"

    result = CliRunner().invoke(
        main, ["submit", "Once upon a time", "--model", "tiny", "--max-tokens", "3", *url]
    )
    assert result.exit_code == 0 and "[length: " in result.output, result.output
    assert r.xlen("conveyor:requests:tiny") == 1

    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text(_line("a", "tiny") + "\n" + _line("b", "tiny") + "\n")
    result = CliRunner().invoke(main, ["batch", "-i", str(inp), "-o", str(out), "--no-progress", *url])
    assert result.exit_code == 0, result.output
    answers = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(a["custom_id"] for a in answers) == ["a", "b"]
    assert all(a["response"]["status_code"] == 200 for a in answers)
    assert r.xlen("conveyor:requests:tiny") == 3

    inp.write_text(_line("c", "tiny") + "\n" + _line("d", "other") + "\n")
    out2 = tmp_path / "out2.jsonl"
    result = CliRunner().invoke(main, ["batch", "-i", str(inp), "-o", str(out2), "--no-progress", *url])
    _one_line_error(result, "no live worker serves model 'other'")
    assert r.xlen("conveyor:requests:tiny") == 3 and not r.exists("conveyor:requests:other")


def test_top_shows_a_backlog_no_live_worker_reads(redis_server, r, tiny_worker):
    """The worker reads conveyor:requests:tiny; a client that names no model added 7 jobs to
    conveyor:requests, which has no consumer group at all."""
    from rich.console import Console

    for k in range(7):
        r.xadd(K.requests, {b"job": json.dumps({"id": f"lost{k}", "prompt": "x"})})
    snap = take(r)
    (view,) = [s for s in snap.streams if s.stream == K.requests]
    assert (view.backlog, view.readers, view.unread) == (7, 0, True)
    (read,) = [s for s in snap.streams if s.stream == "conveyor:requests:tiny"] or [None]
    assert read is None or not read.unread  # the worker's own stream is read (no backlog, or readers)
    console = Console(width=200, record=True)
    console.print(render(snap))
    screen = console.export_text()
    assert "conveyor:requests" in screen and "NO LIVE WORKER READS IT" in screen
    result = CliRunner().invoke(main, ["top", "--once", "--json", "--redis-url", redis_server.url])
    assert {"stream": K.requests, "backlog": 7, "readers": 0} in json.loads(result.output)["streams"]
    # --wait queues where nobody reads, all the same (and waits --timeout for an answer).
    url = ["--redis-url", redis_server.url, "--timeout", "0.5"]
    CliRunner().invoke(main, ["submit", "one more", "--wait", "--id", "lost7", *url])
    assert r.xlen(K.requests) == 8

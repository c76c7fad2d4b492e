"""`conveyor top` as a person sees it: live in tmux against a real worker process on the tiny model, read
with `tmux capture-pane`; the worker killed with kill -9 turns to LOST on the screen."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

from tests.helpers.waiting import wait_until
from tests.helpers.worker_fakes import spawn_worker
from worker.client import enqueue
from worker.fleet import registry
from worker.keys import Keys

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")


def row(screen: str, first_cell: str) -> list[str] | None:
    """The cells of the table row whose first cell is `first_cell` (rich's box-drawing tables)."""
    for line in screen.splitlines():
        cells = [c.strip() for c in re.split(r"[│┃]", line)[1:-1]]
        if cells and cells[0] == first_cell:
            return cells
    return None


@pytest.mark.redis
@pytest.mark.timeout(240)
def test_top_shows_the_worker_and_the_backlog_and_a_killed_worker_as_lost(
    redis_server, r, tiny_model, tmp_path
):
    tmux = ["tmux", "-L", f"conveyor-top-{os.getpid()}"]
    worker = spawn_worker(
        redis_server.url, tiny_model, "topw", tmp_path / "w.log", "--registry-interval", "0.5"
    )
    try:
        record = wait_until(lambda: registry.live(registry.read(r, Keys())), 90, "the worker's record", 0.2)[
            0
        ]
        for k in range(60):  # more than its 16 slots: the rest wait in the stream
            enqueue(r, {"id": f"j{k}", "prompt": "hello", "max_tokens": 200, "ignore_eos": True})
        command = f"env COLUMNS=200 LINES=60 PYTHONPATH={os.getcwd()} {sys.executable} -m worker.cli top --redis-url {redis_server.url}"
        subprocess.run(
            [*tmux, "new-session", "-d", "-s", "top", "-x", "200", "-y", "60", command], check=True
        )

        def screen() -> str:
            return subprocess.run(
                [*tmux, "capture-pane", "-p", "-t", "top"], capture_output=True, text=True, check=True
            ).stdout

        last: list[str] = [""]

        def backlog_shown():
            shown = last[0] = screen()
            model, worker_row = row(shown, record.model), row(shown, "topw")
            if model is None or worker_row is None or not model[1].isdigit() or int(model[1]) == 0:
                return None
            return model, worker_row

        try:
            model, worker_row = wait_until(
                backlog_shown, 60, "the model's backlog and the worker on screen", 0.3
            )
        except AssertionError:
            print(last[0])  # what the screen showed instead
            raise
        lag = r.xinfo_groups(Keys().requests)[0]["lag"]
        assert 0 < lag <= int(model[1]) <= 60 - 16  # the screen is at most a second behind Redis
        assert worker_row[1:3] == [record.model, "live"]
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=30)
        lost = wait_until(lambda: (row(screen(), "topw") or [""] * 3)[2] == "LOST", 10, "LOST on screen", 0.3)
        assert lost
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)
        if worker.poll() is None:
            worker.kill()
            worker.wait()

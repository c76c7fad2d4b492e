"""`conveyor demo` as a person reads it: a whole round (its own redis-server, the tiny random model, a
worker), printed with no terminal and shown in a real one (tmux). The tiny model's text is random bytes:
every row must still be free of control characters and U+FFFD and split at the header's separators, and
one line must say which model runs and that its weights are random."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.columns import assert_aligned, no_hidden_characters
from worker import local_redis

ROOT = Path(__file__).resolve().parents[3]
IDS = ["demo-0", "demo-1", "demo-2", "demo-3"]
MODEL_LINE = "model: tiny:llama, the built-in tiny model"


def demo_args() -> list[str]:
    port = local_redis.free_port()  # nothing answers there: the demo starts its own server
    return [
        "demo",
        "--model",
        "tiny",
        "--jobs",
        str(len(IDS)),
        "--max-tokens",
        "48",
        "--redis-url",
        f"redis://127.0.0.1:{port}/0",
    ]


@pytest.fixture
def demo_env(tmp_path) -> dict[str, str]:
    if local_redis.redis_server_path() is None:
        pytest.skip("redis-server is not installed")
    return {**os.environ, "CONVEYOR_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}


def check_screen(screen: str) -> None:
    model = [line for line in screen.splitlines() if line.startswith("model: ")]
    assert len(model) == 1 and model[0].startswith(MODEL_LINE) and "random" in model[0], screen
    assert "started a local redis-server" in screen and "tokens/s through Redis" in screen, screen
    assert assert_aligned(screen, IDS) >= 3, screen  # 48 random tokens fill a few rows per column


@pytest.mark.redis
@pytest.mark.timeout(180)
def test_demo_prints_clean_aligned_columns_without_a_terminal(demo_env):
    done = subprocess.run(
        [sys.executable, "-m", "worker.cli", *demo_args()],
        cwd=ROOT,
        env={**demo_env, "COLUMNS": "100"},
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert all(no_hidden_characters(line) for line in done.stdout.splitlines()), done.stdout
    check_screen(done.stdout)


@pytest.mark.redis
@pytest.mark.timeout(180)
@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_demo_in_a_terminal_shows_aligned_columns(demo_env, tmp_path):
    # A terminal of its own (this tmux server's socket), 100 x 60; the shell stays after the demo so the
    # screen can be read, and says when the demo ended.
    tmux = ["tmux", "-S", str(tmp_path / "tmux.sock")]
    command = " ".join([sys.executable, "-m", "worker.cli", *demo_args()])
    shell = f"cd {ROOT} && {command}; echo demo-exit-$?; sleep 600"
    subprocess.run(
        [
            *tmux,
            "new-session",
            "-d",
            "-x",
            "100",
            "-y",
            "60",
            "-e",
            f"CONVEYOR_CACHE={demo_env['CONVEYOR_CACHE']}",
        ]
        + ["-e", f"PYTHONPATH={ROOT}", shell],
        check=True,
    )
    try:
        deadline, screen = time.monotonic() + 160, ""
        while "demo-exit-" not in screen:
            assert time.monotonic() < deadline, f"the demo did not end; the screen:\n{screen}"
            time.sleep(0.5)
            screen = subprocess.run(
                [*tmux, "capture-pane", "-p", "-J"], capture_output=True, text=True, check=True
            ).stdout
        assert "demo-exit-0" in screen, screen
        check_screen(screen)
    finally:
        subprocess.run([*tmux, "kill-server"], check=False)

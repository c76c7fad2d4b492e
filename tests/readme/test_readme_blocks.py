"""The README's command blocks run as written, in order, on a fresh machine (tests/helpers/readme_blocks.py).

The full run (marked `readme`, left out of a plain `pytest`; .ci/run runs it) installs the checkout into a
fresh venv with the README's own install line, then runs every block in one bash script against the
redis-server the README starts, on the ports the README names (6379, 8000; the worker's metrics on 9100),
so those must be free. The docker lines and the test-suite block are checked by the fast tests here.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.compose import compose_config
from tests.helpers.readme_blocks import Block, blocks, compose_up, normalized, script

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
PORTS = (6379, 8000, 9100)  # the README's Redis and gateway, the worker's default metrics port
API_BLOCK_MODEL = Path("/tmp/tiny-llama")  # where the README's Python API block writes its tiny model


def of_kind(kind: str) -> list[Block]:
    return [b for b in blocks(README) if b.kind == kind]


def test_each_docker_line_resolves_with_compose():
    lines = [c for b in of_kind("docker") for c in b.commands()]
    assert lines, "the README has no docker block"
    for line in lines:
        up = compose_up(line)
        services = compose_config(*up.files)["services"]
        assert {"redis", "worker"} <= set(services), line
        assert set(up.scaled) <= set(services), line


def test_the_test_suite_block_is_what_ci_runs():
    ci = {normalized(c) for c in Block("bash", (ROOT / ".ci/run").read_text(), 0).commands()}
    (suite,) = of_kind("test-suite")
    for command in suite.commands():
        assert normalized(command) in ci, f"README's `{command}` is not what .ci/run runs"


def test_the_first_install_is_for_running_only():
    first = of_kind("run")[0].commands()[0]
    assert "pip install -e ." in first and "[test]" not in first, first


def free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def checkout_copy(dest: Path) -> Path:
    """The files a fresh clone has (tracked, and new ones git does not ignore): nothing built here."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, (n.decode() for n in listed)):
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    return dest


def fresh_env(tmp_path: Path, venv: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(
        PATH=f"{venv / 'bin'}{os.pathsep}{env['PATH']}",
        VIRTUAL_ENV=str(venv),
        CONVEYOR_CACHE=str(tmp_path / "cache"),  # the tiny model is made on first use, as on a new machine
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        COLUMNS="100",
    )
    return env


@pytest.mark.readme
@pytest.mark.redis
@pytest.mark.timeout(900)
def test_every_readme_block_runs_as_written_in_a_fresh_venv(tmp_path):
    busy = [p for p in PORTS if not free(p)]
    assert not busy, f"ports {busy} are taken; the README's commands use them"
    api_model_existed = API_BLOCK_MODEL.exists()
    src = checkout_copy(tmp_path / "src")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    (tmp_path / "readme.sh").write_text(script(of_kind("run")))
    log = tmp_path / "readme.log"
    with open(log, "wb") as out:
        run = subprocess.Popen(
            ["bash", str(tmp_path / "readme.sh")],
            cwd=src,
            env=fresh_env(tmp_path, venv),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: whatever it leaves is stopped below
        )
        try:
            code = run.wait(timeout=840)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            try:
                os.killpg(run.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            # The README's redis-server daemonizes out of the group; 6379 was free before, so it is ours.
            subprocess.run(["redis-cli", "-p", "6379", "shutdown", "nosave"], capture_output=True, timeout=30)
            if not api_model_existed:
                shutil.rmtree(API_BLOCK_MODEL, ignore_errors=True)
    output = log.read_text(errors="replace")
    assert code == 0, f"exit {code}; the last output:\n{output[-8000:]}"

    # What each section promised, seen in its output and files.
    assert "\nmodel: " in output and "tokens/s through Redis" in output, output[-8000:]  # the demo
    assert '{"type":"token"' in output, output[-8000:]  # redis-cli XREAD read the worker's first event
    assert "data: [DONE]" in output, output[-8000:]  # the curl stream ended
    assert "['tiny-llama']" in output, output[-8000:]  # the Python client's model list
    results = (src / "results.jsonl").read_text()
    assert '"custom_id": "q1"' in results or '"custom_id":"q1"' in results, results
    # The install is for running only: neither triton nor xgrammar came with it.
    absent = subprocess.run(
        [
            str(venv / "bin/python"),
            "-c",
            "import importlib.util as u; print(u.find_spec('triton'), u.find_spec('xgrammar'))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert absent == ["None", "None"], absent

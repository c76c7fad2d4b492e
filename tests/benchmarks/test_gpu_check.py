"""benchmarks/gpu_check.sh's static promises, checked on the CPU: the CUDA tests it runs are all the CUDA
tests there are, every dependency reaches the GPU machine (there, or carried as a wheel), and the wheels
step names any carried wheel whose own needs would be missing there."""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import tomllib
from packaging.requirements import Requirement

from benchmarks.gpu_wheels_check import machine_packages, norm, pins, problems

ROOT = Path(__file__).resolve().parents[2]


def cuda_test_dirs() -> list[str]:
    text = (ROOT / "benchmarks" / "gpu_check.sh").read_text()
    return re.search(r"^CUDA_TEST_DIRS=\(([^)]*)\)", text, re.M).group(1).split()


def test_every_cuda_test_is_in_a_folder_the_check_runs():
    decorator = re.compile(r"^\s*(@pytest\.mark\.cuda\b|pytestmark\b.*\bmark\.cuda\b)", re.M)
    marked = {
        p.relative_to(ROOT) for p in (ROOT / "tests").rglob("test_*.py") if decorator.search(p.read_text())
    }
    assert marked, "no cuda-marked test found"
    dirs = cuda_test_dirs()
    outside = [str(p) for p in marked if not any(str(p).startswith(d + "/") for d in dirs)]
    assert outside == [], f"cuda tests outside CUDA_TEST_DIRS {dirs} (gpu_check.sh would not run them)"


def test_every_dependency_is_on_the_gpu_machine_or_carried():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reachable = machine_packages() | set(pins())
    missing = [d for d in project["dependencies"] if norm(Requirement(d).name) not in reachable]
    assert missing == []


def test_carried_pins_are_what_the_machine_lacks_or_a_newer_typing_extensions():
    assert set(pins()) & machine_packages() == {"typing-extensions"}


def _wheel(folder: Path, name: str, version: str, *needs: str) -> None:
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    meta += "".join(f"Requires-Dist: {n}\n" for n in needs)
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as z:
        z.writestr(f"{name}-{version}.dist-info/METADATA", meta)


def test_the_wheels_step_names_missing_wheels_and_unmet_needs(tmp_path):
    _wheel(
        tmp_path, "fastapi", "1.0", "starlette>=2", "opentelemetry-api", "anyio", 'uvicorn; extra == "all"'
    )
    _wheel(tmp_path, "starlette", "1.5")
    pinned = {"fastapi": "1.0", "starlette": "1.5", "orjson": "3.0"}
    found = problems(tmp_path, pinned, machine={"anyio"})
    assert found == [
        "no wheel for orjson==3.0",
        "fastapi-1.0-py3-none-any.whl needs starlette>=2, gpu_wheels.txt pins 1.5",
        "fastapi-1.0-py3-none-any.whl needs opentelemetry-api: neither pinned in gpu_wheels.txt nor on the GPU machine",
    ]

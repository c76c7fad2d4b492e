"""The GPU check's wheels step: every pin of gpu_wheels.txt has its wheel, and every wheel's own needs
(Requires-Dist, extras aside, markers evaluated for the Python that runs this) are pinned too or on the
GPU machine (gpu_machine_packages.txt). The install there is --no-deps, so a need met by neither would
only show up as an import error, or not at all until the code path that needs it runs.

    python -m benchmarks.gpu_wheels_check WHEELS_DIR
"""

from __future__ import annotations

import re
import sys
import zipfile
from pathlib import Path

from packaging.requirements import Requirement

HERE = Path(__file__).resolve().parent


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_list(path: Path) -> list[str]:
    lines = (line.strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def pins(path: Path = HERE / "gpu_wheels.txt") -> dict[str, str]:
    """{normalised name: version}"""
    return {norm(name): version for name, version in (p.split("==") for p in read_list(path))}


def machine_packages(path: Path = HERE / "gpu_machine_packages.txt") -> set[str]:
    return {norm(p.split("==")[0]) for p in read_list(path)}


def wheel_needs(wheel: Path) -> list[Requirement]:
    """The wheel's Requires-Dist that apply here, extras left out."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    needs = []
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            needs.append(req)
    return needs


def problems(wheels: Path, pinned: dict[str, str], machine: set[str]) -> list[str]:
    found = {}
    for whl in wheels.glob("*.whl"):
        name, version = whl.name.split("-")[:2]
        found[norm(name)] = (version, whl)
    out = [f"no wheel for {n}=={v}" for n, v in pinned.items() if found.get(n, ("",))[0] != v]
    for _, (_, whl) in sorted(found.items()):
        for req in wheel_needs(whl):
            need = norm(req.name)
            if need in pinned:
                if not req.specifier.contains(pinned[need], prereleases=True):
                    out.append(f"{whl.name} needs {req}, gpu_wheels.txt pins {pinned[need]}")
            elif need not in machine:
                out.append(f"{whl.name} needs {req}: neither pinned in gpu_wheels.txt nor on the GPU machine")
    return out


def main() -> None:
    wheels = Path(sys.argv[1])
    pinned = pins()
    print(f"{len(pinned)} pins, {len(list(wheels.glob('*.whl')))} wheels in {wheels}/")
    bad = problems(wheels, pinned, machine_packages())
    for line in bad:
        print(line)
    if bad:
        sys.exit(
            "run `bash benchmarks/gpu_wheels.sh` on a machine with a registry, fix gpu_wheels.txt, carry .whl"
        )


if __name__ == "__main__":
    main()

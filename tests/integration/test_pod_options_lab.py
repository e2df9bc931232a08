"""The pod options and the submission's identity through the operator and the real API server: a
DispatchJob of the ``job`` kind with every pod option the lab can admit, ``kubectl apply``-ed, and
its pod as kube-controller-manager's Job controller created it (the API server validated the pod
template; kwok runs no container). And what the CRD itself refuses, naming the field, for a client
that never reaches the webhook.

Run: ``.venv/bin/pytest -p no:cacheprovider tests/integration/test_pod_options_lab.py``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from tests.integration.conftest import OperatorProcess, apply, await_for
from tests.support.builders import lab_manifest
from tests.support.kube import KubeCluster

pytestmark = pytest.mark.integration

OPTIONS: dict[str, Any] = {
    "env": {"A": "1"},
    "volumes": [
        {"name": "ckpt", "persistentVolumeClaim": {"claimName": "checkpoints"}},
        {"name": "scratch", "emptyDir": {}},
    ],
    "volumeMounts": [{"name": "ckpt", "mountPath": "/ckpt"}, {"name": "scratch", "mountPath": "/scratch"}],
    "shmSize": "2Gi",
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "serviceAccountName": "trainer",
    "podLabels": {"team": "research"},
    "podAnnotations": {"note": "x"},
    "workingDir": "/scratch",
}
"""Every option but the PriorityClass (the lab has none: the Priority admission would refuse the
pod) and the Secrets and ConfigMaps (same shape as the PVC, which the API server does not look up)."""


def pods(cluster: KubeCluster, namespace: str, job: str) -> list[dict[str, Any]]:
    out = json.loads(
        cluster.kubectl("get", "pods", "-n", namespace, "-l", f"dispatch.dev/job={job}", "-o", "json")
    )
    items: list[dict[str, Any]] = out["items"]
    return items


async def test_every_pod_option_and_the_identity_reach_the_pod(
    crds: KubeCluster, namespace: str, operator: Callable[..., OperatorProcess]
) -> None:
    crds.apply(
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "trainer"}}, namespace=namespace
    )
    operator("--backend", "job")
    manifest = lab_manifest("job", "options", [], options=OPTIONS, stop={"gracePeriodSeconds": 90})
    apply(crds, namespace, manifest)
    found: list[dict[str, Any]] = await await_for("the job's pod", lambda: pods(crds, namespace, "options"))
    (pod,) = found
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["labels"]["team"] == "research"
    assert meta["labels"]["dispatch.dev/submission"] == "1"
    assert meta["annotations"]["note"] == "x"
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["ckpt"]["persistentVolumeClaim"] == {"claimName": "checkpoints"}
    assert volumes["scratch"]["emptyDir"] == {}
    assert volumes["dispatch-shm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "2Gi"}
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert spec["serviceAccountName"] == "trainer"
    assert spec["terminationGracePeriodSeconds"] == 90
    (main,) = spec["containers"]
    mounts = {m["mountPath"]: m["name"] for m in main["volumeMounts"]}
    assert {"/ckpt": "ckpt", "/scratch": "scratch", "/dev/shm": "dispatch-shm"}.items() <= mounts.items()
    assert main["workingDir"] == "/scratch"
    env = {e["name"]: e.get("value") for e in main["env"]}
    assert env == {
        "A": "1",
        "DISPATCH_JOB": "options",
        "DISPATCH_NAMESPACE": namespace,
        "DISPATCH_SUBMISSION": "1",
    }


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"volumes": [{"name": "h", "hostPath": {"path": "/"}}]}, "spec.job.volumes[0].hostPath"),
        ({"env": {"DISPATCH_SUBMISSION": "9"}}, "spec.job.env"),
        ({"podLabels": {"dispatch.dev/job": "x"}}, "spec.job.podLabels"),
        ({"volumes": [{"name": "v"}]}, "spec.job.volumes[0]"),
    ],
)
def test_the_api_server_refuses_naming_the_field(
    crds: KubeCluster, namespace: str, options: dict[str, Any], field: str
) -> None:
    """Without an operator (so without the webhook): the CRD's schema and rules alone."""
    refused = apply(crds, namespace, lab_manifest("job", "refused", [], options=options), check=False)
    assert refused.returncode != 0
    assert field in refused.stderr

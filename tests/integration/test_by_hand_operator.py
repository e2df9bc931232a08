"""Suspend, resume and retry by a person through the operator and the DispatchJob, on the lab's
batch/v1 Job (the real kube-controller-manager and kube-scheduler, pods on kwok nodes): a suspend
stops submission 1's Job, the resume creates submission 2's, a failed job raised ``spec.retry.count``
reopens with submission 3's. Each patch carries the annotation the mutating webhook would stamp
(test_by_hand_kube.py proves the stamping), and the history names each person.

Run: ``.venv/bin/pytest -m integration tests/integration/test_by_hand_operator.py``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest

from tests.integration.conftest import OperatorProcess, await_for, get_job, settled
from tests.integration.conftest import apply as kubectl_apply
from tests.support.builders import lab_manifest
from tests.support.kube import KubeCluster
from tests.support.lab import Kubeflow

pytestmark = pytest.mark.integration


def jobs(cluster: KubeCluster, namespace: str) -> dict[str, dict[str, Any]]:
    out = json.loads(cluster.kubectl("get", "jobs.batch", "-n", namespace, "-o", "json"))
    return {o["metadata"]["name"]: o for o in out["items"]}


def ask(cluster: KubeCluster, namespace: str, who: str, annotation: str, spec: dict[str, Any]) -> None:
    """What a person's ``kubectl patch`` becomes once the webhook has named them."""
    patch = {"metadata": {"annotations": {f"dispatch.dev/{annotation}": f"human:{who}"}}, "spec": spec}
    cluster.kubectl("patch", "dispatchjob", "hand", "-n", namespace, "--type=merge", "-p", json.dumps(patch))


def recorded(cluster: KubeCluster, namespace: str) -> str:
    return str((get_job(cluster, namespace, "hand").get("status") or {}).get("state"))


async def test_suspend_resume_and_retry_through_the_operator(
    crds: KubeCluster, namespace: str, operator: Callable[..., OperatorProcess], kubeflow: Kubeflow
) -> None:
    operator("--backend", "job")
    await asyncio.to_thread(kubectl_apply, crds, namespace, lab_manifest("job", "hand", []))
    (first,) = await asyncio.wait_for(kubeflow.wait_workload_pods(namespace, "hand", 1), 90)

    await asyncio.to_thread(ask, crds, namespace, "bob", "suspended-by", {"suspend": True})
    await await_for("suspended", lambda: recorded(crds, namespace) == "suspended")

    await asyncio.wait_for(kubeflow.wait_pod_gone(namespace, first), 90)  # its stop ran to the end
    assert recorded(crds, namespace) == "suspended"
    assert "hand-2" not in jobs(crds, namespace)  # no next submission while suspended

    await asyncio.to_thread(ask, crds, namespace, "carol", "suspended-by", {"suspend": False})
    (pod,) = await asyncio.wait_for(kubeflow.wait_workload_pods(namespace, "hand", 2), 90)
    await kubeflow.exit_pod(namespace, pod, 3, container="main")
    body = await settled(crds, namespace, "hand")
    assert body["status"]["state"] == "failed"

    await asyncio.to_thread(ask, crds, namespace, "dan", "retried-by", {"retry": {"count": 1}})
    (pod,) = await asyncio.wait_for(kubeflow.wait_workload_pods(namespace, "hand", 3), 90)
    await kubeflow.exit_pod(namespace, pod, 0, container="main")
    await await_for("succeeded", lambda: recorded(crds, namespace) == "succeeded")
    body = await settled(crds, namespace, "hand")
    history = [(t["from"], t["to"], t.get("submission"), t["actor"]["id"]) for t in body["status"]["history"]]
    assert history == [
        ("pending", "suspended", 1, "bob"),
        ("suspended", "pending", 2, "carol"),
        ("pending", "failed", 2, "supervisor"),
        ("failed", "pending", 3, "dan"),
        ("pending", "succeeded", 3, "supervisor"),
    ]
    assert body["status"]["retries"] == 1
    assert [s["authorizedBy"]["id"] for s in body["status"]["submissions"]] == ["supervisor", "carol", "dan"]

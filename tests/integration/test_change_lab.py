"""A rule's change through the operator on the lab, for each Kubernetes kind: an out-of-memory kill
(the kubelet's OOMKilled, exit 137, as kwok writes it) recovered by a resubmission whose pods ask
for twice the memory, as the kind's own controller (the Job controller, JobSet, the training
operator, Trainer) built them from the object dispatch created; the record says what changed.

Run: ``.venv/bin/pytest -m integration tests/integration/test_change_lab.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from tests.integration.conftest import OperatorProcess, apply, history, settled
from tests.support.builders import lab_manifest
from tests.support.kube import KubeCluster
from tests.support.lab import Kubeflow

pytestmark = pytest.mark.integration

GROWS: list[dict[str, Any]] = [
    {"on": ["out-of-memory"], "budget": 1, "change": {"memory": {"factor": 2, "max": "4Gi"}}}
]
"""Twice the memory after an OOM kill, once (the lab's pods ask for 1Gi: tests.support.builders)."""


@dataclass(frozen=True)
class Kind:
    backend: str
    container: str
    """The training container of its pods."""
    extras: bool


KINDS = [
    pytest.param(Kind("job", "main", extras=False), id="job"),
    pytest.param(Kind("jobset", "main", extras=True), id="jobset"),
    pytest.param(Kind("kubeflow", "pytorch", extras=False), id="kubeflow"),
    pytest.param(Kind("trainjob", "node", extras=True), id="trainjob"),
]


def memory(pod: dict[str, Any], container: str) -> tuple[str | None, str | None]:
    """The training container's memory request and limit, as the pod the kind's controller made has them."""
    (main,) = [c for c in pod["spec"]["containers"] if c["name"] == container]
    resources = main.get("resources") or {}
    return (resources.get("requests") or {}).get("memory"), (resources.get("limits") or {}).get("memory")


async def running_pod(kubeflow: Kubeflow, namespace: str, job: str, n: int) -> dict[str, Any]:
    (name,) = await asyncio.wait_for(kubeflow.wait_workload_pods(namespace, job, n), 90)
    (pod,) = [p for p in await kubeflow.workload_pods(namespace, job, n) if p["metadata"]["name"] == name]
    return pod


@pytest.mark.parametrize("kind", KINDS)
async def test_an_oom_is_recovered_with_twice_the_memory_in_the_next_objects_pods(
    kind: Kind,
    crds: KubeCluster,
    namespace: str,
    operator: Callable[..., OperatorProcess],
    kubeflow: Kubeflow,
    request: pytest.FixtureRequest,
) -> None:
    if kind.extras:
        request.getfixturevalue("lab_extras")
    operator("--backend", kind.backend)
    await asyncio.to_thread(apply, crds, namespace, lab_manifest(kind.backend, "grows", GROWS))
    first = await running_pod(kubeflow, namespace, "grows", 1)
    assert memory(first, kind.container) == ("1Gi", "1Gi")
    await kubeflow.exit_pod(
        namespace, first["metadata"]["name"], 137, reason="OOMKilled", container=kind.container
    )
    second = await running_pod(kubeflow, namespace, "grows", 2)
    assert memory(second, kind.container) == ("2Gi", "2Gi")
    await kubeflow.exit_pod(namespace, second["metadata"]["name"], 0, container=kind.container)
    body = await settled(crds, namespace, "grows")
    assert history(body) == [
        ("pending", "recovering", 2, "out-of-memory"),
        ("recovering", "succeeded", 2, "none"),
    ]
    status = body["status"]
    assert status["submissions"][1]["changes"] == [
        {"field": f"spec.{kind.backend}.resources.memory", "from": "1Gi", "to": "2Gi"}
    ]
    assert "changes" not in status["submissions"][0]
    assert status["plan"]["rules"][0]["change"] == "memory x2 per firing, at most 4Gi"

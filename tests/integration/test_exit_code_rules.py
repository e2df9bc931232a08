"""A rule on exit codes through the operator, on the lab: ``kubectl apply`` of a DispatchJob with
``spec.backend: job`` whose one rule resubmits on ``non-zero-exit`` with code 137 only; kwok plays
the kubelet and makes the training container exit with the code the test chooses
(lab-container-exit in tests/support/kwok.yaml), kube-controller-manager's Job controller fails the
Job, and the operator's supervisor answers by the code.

Run: ``.venv/bin/pytest -m integration tests/integration/test_exit_code_rules.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from tests.integration.conftest import OperatorProcess, apply, await_for, get_job, history, settled
from tests.support.builders import lab_manifest
from tests.support.kube import KubeCluster
from tests.support.lab import Kubeflow

pytestmark = pytest.mark.integration

ON_137: list[dict[str, object]] = [
    {
        "on": ["non-zero-exit"],
        "action": "resubmit",
        "budget": 2,
        "exitCodes": {"operator": "In", "values": [137]},
    }
]


async def exit_the_pod(kubeflow: Kubeflow, namespace: str, name: str, n: int, code: int) -> None:
    """The training container of submission ``n``'s one pod exits with ``code`` (a plain exit:
    reason Error, as the kubelet writes for any code but an OOM kill)."""
    (pod,) = await asyncio.wait_for(kubeflow.wait_workload_pods(namespace, name, n), 60)
    await kubeflow.exit_pod(namespace, pod, code, container="main")


async def test_code_137_is_resubmitted_and_code_3_fails_the_job_naming_it(
    crds: KubeCluster, namespace: str, operator: Callable[..., OperatorProcess], kubeflow: Kubeflow
) -> None:
    operator("--backend", "job")
    await asyncio.to_thread(apply, crds, namespace, lab_manifest("job", "codes", ON_137))

    await exit_the_pod(kubeflow, namespace, "codes", 1, 137)

    def resubmitted() -> bool:
        status = get_job(crds, namespace, "codes").get("status") or {}
        return len(status.get("submissions") or ()) == 2

    await await_for("codes resubmitted after exit code 137", resubmitted)
    await exit_the_pod(kubeflow, namespace, "codes", 2, 3)

    body = await settled(crds, namespace, "codes")
    status = body["status"]
    assert status["state"] == "failed"
    assert (status["cause"]["kind"], status["cause"]["exitCode"]) == ("non-zero-exit", 3)
    assert "exited with code 3" in status["cause"]["detail"]
    assert [s["cause"]["exitCode"] for s in status["submissions"]] == [137, 3]
    assert history(body) == [
        ("pending", "recovering", 2, "non-zero-exit"),
        ("recovering", "failed", 2, "non-zero-exit"),
    ]
    assert [h["cause"]["exitCode"] for h in status["history"]] == [137, 3]
    plan = status["plan"]
    assert plan["rules"][0]["enforcer"] == "supervisor"
    assert plan["rules"][0]["firings"] == 1
    assert "non-zero-exit" in plan["uncovered"]
    assert plan["uncoveredExitCodes"] == {"operator": "NotIn", "values": [137]}

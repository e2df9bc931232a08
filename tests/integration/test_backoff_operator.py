"""A rule's backoff through the operator on the lab: a batch/v1 Job preempted by kube-scheduler's
eviction, status ``recovering`` with the time of the next submission while the backoff runs, the
operator SIGKILLed in the wait and restarted, and submission 2 created only once the time the
record gives has passed.

Run: ``.venv/bin/pytest -m integration tests/integration/test_backoff_operator.py``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest

from tests.integration.conftest import OperatorProcess, await_for, get_job, history, settled
from tests.integration.conftest import apply as kubectl_apply
from tests.support.builders import SEED_HISTORY, lab_manifest
from tests.support.kube import KubeCluster
from tests.support.lab import Kubeflow

pytestmark = pytest.mark.integration

BACKOFF_SECONDS = 3
RULES: list[dict[str, Any]] = [
    {"on": ["preempted"], "budget": 1, "backoff": {"baseSeconds": BACKOFF_SECONDS}}
]


def jobs(cluster: KubeCluster, namespace: str) -> list[str]:
    out = json.loads(cluster.kubectl("get", "jobs.batch", "-n", namespace, "-o", "json"))
    return sorted(o["metadata"]["name"] for o in out["items"])


def when(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


async def test_a_backoff_is_shown_survives_a_sigkill_and_delays_submission_2(
    crds: KubeCluster, namespace: str, operator: Callable[..., OperatorProcess], kubeflow: Kubeflow
) -> None:
    op = operator("--backend", "job")
    await asyncio.to_thread(kubectl_apply, crds, namespace, lab_manifest("job", "slow", RULES))
    (pod,) = await asyncio.wait_for(kubeflow.wait_workload_pods(namespace, "slow", 1), 60)
    await kubeflow.preempt_pod(namespace, pod)

    def waiting() -> dict[str, Any] | None:
        body = get_job(crds, namespace, "slow")
        status = body.get("status") or {}
        note = str(status.get("observedNote") or "")
        return status if note.startswith("next submission at") else None

    status: dict[str, Any] = await await_for("the backoff shown in status", waiting, interval=0.1)
    assert status["observedState"] == "recovering"
    assert status["observedCause"] == "preempted"
    ended_at = when(status["submissions"][0]["endedAt"])
    due = ended_at + timedelta(seconds=BACKOFF_SECONDS)
    assert status["observedNote"] == (
        f"next submission at {due:%Y-%m-%dT%H:%M:%SZ} (backoff 3 s before firing 1 of rule 0)"
    )
    assert [s["n"] for s in status["submissions"]] == [1]
    assert await asyncio.to_thread(jobs, crds, namespace) == ["slow-1"]

    op.kill()  # in the wait: nothing of it is kept but the record
    op.start()
    (pod,) = await asyncio.wait_for(kubeflow.wait_workload_pods(namespace, "slow", 2), 60)
    await kubeflow.exit_pod(namespace, pod, 0, container="main")
    body = await settled(crds, namespace, "slow")
    first, second = body["status"]["submissions"]
    assert when(first["endedAt"]) == ended_at
    assert when(second["authorizedAt"]) >= due
    assert history(body) == SEED_HISTORY
    assert body["status"]["plan"]["rules"][0]["backoff"] == {
        "baseSeconds": 3,
        "factor": 2.0,
        "maxSeconds": 600,
    }


async def test_a_supervised_time_limit_is_shown_survives_a_sigkill_and_stops_at_the_limit(
    crds: KubeCluster, namespace: str, operator: Callable[..., OperatorProcess], kubeflow: Kubeflow
) -> None:
    """A PyTorchJob's time limit is the supervisor's: a timer from the pods' start, computed from
    the record and the observed start, so an operator SIGKILLed in the wait stops the submission
    at the same time. Both submissions hit it: the rule answers the first, the second fails."""
    rules = [{"on": ["time-limit"], "budget": 1}]
    op = operator("--backend", "kubeflow")
    manifest = lab_manifest("kubeflow", "limited", rules, timeLimitSeconds=6)
    await asyncio.to_thread(kubectl_apply, crds, namespace, manifest)

    def running() -> dict[str, Any] | None:
        status = get_job(crds, namespace, "limited").get("status") or {}
        note = str(status.get("observedNote") or "")
        return status if note.startswith("running; stopped at") else None

    status: dict[str, Any] = await await_for("the time limit shown in status", running, interval=0.1)
    stop_at = when(status["observedNote"].split("stopped at ")[1].split(" ")[0])
    assert status["plan"]["timeLimit"]["enforcer"] == "supervisor"
    op.kill()  # in the wait: nothing of it is kept but the record and the pods' start
    op.start()
    body = await settled(crds, namespace, "limited")
    first = body["status"]["submissions"][0]
    assert first["stop"]["actor"]["kind"] == "supervisor"
    assert when(first["stop"]["time"]) >= stop_at
    assert history(body) == [
        ("pending", "recovering", 2, "time-limit"),
        ("recovering", "failed", 2, "time-limit"),
    ]

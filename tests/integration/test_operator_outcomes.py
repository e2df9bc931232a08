"""The operator's outcomes on Kubeflow (through the fake training operator): what fails and why,
causes told apart, cancel that keeps the record, delete that ends every object first."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest

from tests.integration.conftest import (
    OperatorProcess,
    ReleaseMonitor,
    apply,
    await_for,
    condition,
    dispatch_job,
    get_job,
    history,
    pytorchjobs,
    released,
)
from tests.support.kube import KubeCluster

pytestmark = pytest.mark.integration


async def running_pj(cluster: KubeCluster, namespace: str, job: str, submission: int, fake: Any) -> str:
    """The released PyTorchJob of (job, submission) once its pods run; returns its name."""

    def probe() -> str | None:
        for pj in pytorchjobs(cluster, namespace):
            labels = pj["metadata"].get("labels") or {}
            if (
                labels.get("dispatch.dev/job") == job
                and labels.get("dispatch.dev/submission") == str(submission)
                and released(pj)
            ):
                return str(pj["metadata"]["name"])
        return None

    name: str = await await_for(f"{job} submission {submission} released", probe)
    await asyncio.wait_for(fake.wait_pods(namespace, name, 1), 60)
    return name


async def settled(cluster: KubeCluster, namespace: str, job: str) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        body = get_job(cluster, namespace, job)
        return body if (body.get("status") or {}).get("settled") else None

    body: dict[str, Any] = await await_for(f"{job} settled", probe)
    return body


async def test_uncovered_cause_fails_the_job_with_that_cause(
    crds: KubeCluster, namespace: str, operator: Callable[..., OperatorProcess], fake: Any
) -> None:
    operator()
    await asyncio.to_thread(apply, crds, namespace, dispatch_job("crash", nodes=1))
    name = await running_pj(crds, namespace, "crash", 1, fake)
    await fake.exit(namespace, name, 1)
    await asyncio.to_thread(
        crds.kubectl, "wait", "-n", namespace, "dispatchjob/crash", "--for=condition=Failed", "--timeout=60s"
    )
    body = await settled(crds, namespace, "crash")
    assert body["status"]["state"] == "failed"
    assert body["status"]["cause"]["kind"] == "non-zero-exit"
    assert body["status"]["cause"]["exitCode"] == 1
    assert history(body) == [("pending", "failed", 1, "non-zero-exit")]
    stalled = condition(body, "Stalled")
    assert stalled is not None
    assert stalled["reason"] == "Failed"
    assert "not covered by any rule" in stalled["message"]
    assert condition(body, "Reconciling") is None


async def test_exhausted_budget_fails_the_job(
    crds: KubeCluster,
    namespace: str,
    operator: Callable[..., OperatorProcess],
    fake: Any,
    release_monitor: ReleaseMonitor,
) -> None:
    operator()
    manifest = dispatch_job("twice", nodes=1, rules=[{"on": ["preempted"], "budget": 1}])
    await asyncio.to_thread(apply, crds, namespace, manifest)
    await fake.preempt(namespace, await running_pj(crds, namespace, "twice", 1, fake))
    await fake.preempt(namespace, await running_pj(crds, namespace, "twice", 2, fake))
    body = await settled(crds, namespace, "twice")
    assert history(body) == [
        ("pending", "recovering", 2, "preempted"),
        ("recovering", "failed", 2, "preempted"),
    ]
    assert body["status"]["plan"]["rules"][0]["firings"] == 1
    failed = condition(body, "Failed")
    assert failed is not None
    assert failed["status"] == "True"
    assert "used its budget (1/1)" in failed["message"]
    assert len(await asyncio.to_thread(pytorchjobs, crds, namespace)) == 2
    assert release_monitor.max_live["twice"] == 1


async def test_oom_and_node_loss_are_told_apart_from_preemption(
    crds: KubeCluster, namespace: str, operator: Callable[..., OperatorProcess], fake: Any
) -> None:
    operator()
    preempt_only = [{"on": ["preempted"], "budget": 2}]
    await asyncio.to_thread(apply, crds, namespace, dispatch_job("oom", nodes=1, rules=preempt_only))
    await asyncio.to_thread(apply, crds, namespace, dispatch_job("lost", nodes=1, rules=preempt_only))
    node_rule = [{"on": ["node-lost"], "budget": 1}]
    await asyncio.to_thread(apply, crds, namespace, dispatch_job("survivor", nodes=1, rules=node_rule))

    await fake.oom(namespace, await running_pj(crds, namespace, "oom", 1, fake))
    await fake.lose_node(namespace, await running_pj(crds, namespace, "lost", 1, fake))
    await fake.lose_node(namespace, await running_pj(crds, namespace, "survivor", 1, fake))
    await fake.succeed(namespace, await running_pj(crds, namespace, "survivor", 2, fake))

    oom = await settled(crds, namespace, "oom")
    assert history(oom) == [("pending", "failed", 1, "out-of-memory")]
    lost = await settled(crds, namespace, "lost")
    assert history(lost) == [("pending", "failed", 1, "node-lost")]
    survivor = await settled(crds, namespace, "survivor")
    assert history(survivor) == [
        ("pending", "recovering", 2, "node-lost"),
        ("recovering", "succeeded", 2, "none"),
    ]


async def test_cancel_keeps_the_record_and_names_the_actor(
    crds: KubeCluster, namespace: str, operator: Callable[..., OperatorProcess], fake: Any
) -> None:
    operator()
    await asyncio.to_thread(apply, crds, namespace, dispatch_job("stopme"))
    name = await running_pj(crds, namespace, "stopme", 1, fake)
    before = await asyncio.to_thread(get_job, crds, namespace, "stopme")
    # what the mutating webhook does on the update that cancels: name the requesting user
    patch = {
        "metadata": {"annotations": {"dispatch.dev/cancelled-by": "human:ada"}},
        "spec": {"cancel": True},
    }
    await asyncio.to_thread(
        crds.kubectl,
        "patch",
        "dispatchjob",
        "stopme",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        json.dumps(patch),
    )
    await asyncio.to_thread(
        crds.kubectl, "wait", "-n", namespace, "dispatchjob/stopme", "--for=condition=Failed", "--timeout=60s"
    )
    body = await settled(crds, namespace, "stopme")
    status = body["status"]
    assert status["state"] == "cancelled"
    assert status["history"][-1]["to"] == "cancelled"
    assert status["history"][-1]["actor"] == {"kind": "human", "id": "ada"}
    assert status["cancel"]["actor"] == {"kind": "human", "id": "ada"}
    # the record is kept: plan, submissions and the canonical are all still there
    assert status["plan"] == before["status"]["plan"]
    assert status["submissions"][0]["canonical"] == f"{namespace}/{name}"
    failed = condition(body, "Failed")
    assert failed is not None
    assert failed["reason"] == "Cancelled"
    assert failed["observedGeneration"] == body["metadata"]["generation"] == 2
    assert await asyncio.to_thread(pytorchjobs, crds, namespace) == []  # ended (deleted)


async def test_delete_ends_every_object_before_the_finalizer_goes(
    crds: KubeCluster, namespace: str, operator: Callable[..., OperatorProcess], fake: Any
) -> None:
    op = operator()
    await asyncio.to_thread(apply, crds, namespace, dispatch_job("gone"))
    name = await running_pj(crds, namespace, "gone", 1, fake)
    assert len(await fake.pods(namespace, name)) == 2
    body = await asyncio.to_thread(get_job, crds, namespace, "gone")
    assert "dispatch.dev/finalizer" in body["metadata"]["finalizers"]
    # stop the operator: the finalizer holds the object until an operator has ended its objects
    op.stop()
    await asyncio.to_thread(crds.kubectl, "delete", "dispatchjob", "gone", "-n", namespace, "--wait=false")
    await asyncio.sleep(1)
    held = await asyncio.to_thread(get_job, crds, namespace, "gone")
    assert held["metadata"]["deletionTimestamp"]
    assert len(await asyncio.to_thread(pytorchjobs, crds, namespace)) == 1
    operator()
    await asyncio.to_thread(
        crds.kubectl, "wait", "-n", namespace, "dispatchjob/gone", "--for=delete", "--timeout=60s"
    )
    # a bare API server has no garbage collector: only the operator can have deleted these
    assert await asyncio.to_thread(pytorchjobs, crds, namespace) == []
    assert await fake.pods(namespace, name) == []


async def test_settled_job_is_deleted_quickly(
    crds: KubeCluster, namespace: str, operator: Callable[..., OperatorProcess], fake: Any
) -> None:
    operator()
    await asyncio.to_thread(apply, crds, namespace, dispatch_job("done", nodes=1))
    await fake.succeed(namespace, await running_pj(crds, namespace, "done", 1, fake))
    await settled(crds, namespace, "done")
    await asyncio.to_thread(
        crds.kubectl, "delete", "dispatchjob", "done", "-n", namespace, "--wait=true", "--timeout=30s"
    )

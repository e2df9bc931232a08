"""The `job` backend through the operator, driven as a user drives it: ``kubectl apply`` of a
DispatchJob with ``spec.backend: job``, on the lab (kube-controller-manager's real Job controller,
kube-scheduler, kwok as the kubelet).

Lifecycle with a preemption by kube-scheduler recovered, a native rule enforced by the Job
controller, exit codes, cancel and delete, and the operator SIGKILLed mid-protocol with never two
released Jobs of one DispatchJob (a watch checks every state the API server held).
Run: ``.venv/bin/pytest -m integration tests/integration/test_job_operator.py``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import pytest
import yaml

from tests.integration.conftest import (
    WAIT,
    OperatorProcess,
    ReleaseMonitor,
    apply,
    await_for,
    follow_releases,
    get_job,
    history,
    settled,
)
from tests.support.kube import KubeCluster
from tests.support.lab import Kubeflow

pytestmark = pytest.mark.integration

SEED_HISTORY = [("pending", "recovering", 2, "preempted"), ("recovering", "succeeded", 2, "none")]
JOB_FINISHED = ("Complete", "Failed", "FailureTarget", "SuccessCriteriaMet")


def manifest(name: str, rules: list[dict[str, Any]], **spec: Any) -> str:
    body = {
        "apiVersion": "dispatch.dev/v1alpha1",
        "kind": "DispatchJob",
        "metadata": {"name": name},
        "spec": {
            "backend": "job",
            "command": ["python", "train.py"],
            "job": {"image": "example.invalid/train:1", "resources": {"cpu": "1", "memory": "1Gi"}},
            "recovery": {"rules": rules},
            **spec,
        },
    }
    return yaml.safe_dump(body, sort_keys=False)


PREEMPTED_ONCE = [{"on": ["preempted"], "budget": 1}]


@pytest.fixture
async def job_monitor(crds: KubeCluster, namespace: str) -> AsyncIterator[ReleaseMonitor]:
    """Every state of every batch/v1 Job of the namespace: never two released at once per job."""
    monitor = ReleaseMonitor(
        suspended=lambda o: bool((o.get("spec") or {}).get("suspend")), finished=JOB_FINISHED
    )
    async with follow_releases(crds, namespace, ("batch", "v1", "jobs"), monitor) as followed:
        yield followed


def listed(cluster: KubeCluster, *args: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads(cluster.kubectl("get", *args, "-o", "json"))["items"]
    return items


def jobs(cluster: KubeCluster, namespace: str) -> list[dict[str, Any]]:
    items = listed(cluster, "jobs.batch", "-n", namespace)
    return sorted(items, key=lambda j: j["metadata"]["name"])


def is_released(job: Mapping[str, Any]) -> bool:
    return not (job.get("spec") or {}).get("suspend")


async def released_job(cluster: KubeCluster, namespace: str, name: str, submission: int) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        for job in jobs(cluster, namespace):
            labels = job["metadata"].get("labels") or {}
            if labels.get("dispatch.dev/job") == name and labels.get("dispatch.dev/submission") == str(
                submission
            ):
                return job if is_released(job) else None
        return None

    found: dict[str, Any] = await await_for(f"{name} submission {submission} released", probe)
    return found


async def test_preemption_is_recovered_and_the_job_is_built_as_documented(
    crds: KubeCluster,
    namespace: str,
    operator: Callable[..., OperatorProcess],
    kubeflow: Kubeflow,
    job_monitor: ReleaseMonitor,
) -> None:
    operator("--backend", "job")
    await asyncio.to_thread(apply, crds, namespace, manifest("finetune", PREEMPTED_ONCE))
    first = await released_job(crds, namespace, "finetune", 1)
    assert first["metadata"]["ownerReferences"][0]["kind"] == "DispatchJob"
    assert "dispatch.dev/record-before-delete" in first["metadata"]["finalizers"]
    assert first["spec"]["podReplacementPolicy"] == "Failed"
    assert first["spec"]["backoffLimit"] == 0
    assert first["spec"]["template"]["spec"]["containers"][0]["name"] == "main"
    (victim,) = await asyncio.wait_for(kubeflow.wait_workload_pods(namespace, "finetune", 1), 60)
    await kubeflow.preempt_pod(namespace, victim)
    await released_job(crds, namespace, "finetune", 2)
    (pod,) = await asyncio.wait_for(kubeflow.wait_workload_pods(namespace, "finetune", 2), 60)
    await kubeflow.exit_pod(namespace, pod, 0)
    body = await settled(crds, namespace, "finetune")
    status = body["status"]
    assert history(body) == SEED_HISTORY
    assert status["submissions"][0]["cause"]["kind"] == "preempted"
    assert status["plan"]["rules"][0]["enforcer"] == "supervisor"
    job_monitor.assert_held()
    assert job_monitor.max_live.get("finetune", 0) == 1
    assert job_monitor.released["finetune"] == {"finetune-1", "finetune-2"}


async def test_a_native_rule_is_enforced_by_the_job_controller(
    crds: KubeCluster,
    namespace: str,
    operator: Callable[..., OperatorProcess],
    kubeflow: Kubeflow,
    job_monitor: ReleaseMonitor,
) -> None:
    """restart on exactly [non-zero-exit out-of-memory]: planned for the scheduler, built as
    backoffLimit + podFailurePolicy; the Job controller replaces the failed pod (one Job, one
    submission), and the restart is on the record."""
    rules = [{"on": ["non-zero-exit", "out-of-memory"], "action": "restart", "budget": 1}]
    operator("--backend", "job")
    await asyncio.to_thread(apply, crds, namespace, manifest("native", rules))
    job = await released_job(crds, namespace, "native", 1)
    assert job["spec"]["backoffLimit"] == 1
    assert [r["action"] for r in job["spec"]["podFailurePolicy"]["rules"]] == ["FailJob", "Count"]
    (first,) = await asyncio.wait_for(kubeflow.wait_workload_pods(namespace, "native", 1), 60)
    await kubeflow.exit_pod(namespace, first, 1)
    (second,) = await asyncio.wait_for(
        kubeflow.wait_workload_pods(namespace, "native", 1, besides=(first,)), 60
    )
    await await_for(
        "the restart recorded",
        lambda: (
            (get_job(crds, namespace, "native")["status"].get("submissions") or [{}])[0].get("restarts") == 1
        ),
    )
    await kubeflow.exit_pod(namespace, second, 0)
    body = await settled(crds, namespace, "native")
    status = body["status"]
    assert status["state"] == "succeeded"
    assert status["plan"]["rules"][0]["enforcer"] == "scheduler"
    assert [s["n"] for s in status["submissions"]] == [1]
    assert [j["metadata"]["name"] for j in await asyncio.to_thread(jobs, crds, namespace)] == ["native-1"]
    job_monitor.assert_held()


@pytest.mark.parametrize(
    ("code", "reason", "kind"), [(3, None, "non-zero-exit"), (137, "OOMKilled", "out-of-memory")]
)
async def test_exit_codes_and_oom_fail_the_job_with_their_cause(
    crds: KubeCluster,
    namespace: str,
    operator: Callable[..., OperatorProcess],
    kubeflow: Kubeflow,
    code: int,
    reason: str | None,
    kind: str,
) -> None:
    operator("--backend", "job")
    await asyncio.to_thread(apply, crds, namespace, manifest("fails", PREEMPTED_ONCE))
    (pod,) = await asyncio.wait_for(kubeflow.wait_workload_pods(namespace, "fails", 1), 60)
    await kubeflow.exit_pod(namespace, pod, code, reason=reason)
    body = await settled(crds, namespace, "fails")
    status = body["status"]
    assert status["state"] == "failed"
    assert status["cause"]["kind"] == kind
    assert status["cause"]["exitCode"] == code


async def test_cancel_then_delete_leaves_nothing(
    crds: KubeCluster,
    namespace: str,
    operator: Callable[..., OperatorProcess],
    kubeflow: Kubeflow,
) -> None:
    operator("--backend", "job")
    await asyncio.to_thread(apply, crds, namespace, manifest("stopme", PREEMPTED_ONCE))
    await asyncio.wait_for(kubeflow.wait_workload_pods(namespace, "stopme", 1), 60)
    await asyncio.to_thread(apply, crds, namespace, manifest("stopme", PREEMPTED_ONCE, cancel=True))
    body = await settled(crds, namespace, "stopme")
    assert body["status"]["state"] == "cancelled"
    assert await asyncio.to_thread(jobs, crds, namespace) == []
    await asyncio.to_thread(crds.kubectl, "delete", "dispatchjob", "stopme", "-n", namespace, "--timeout=60s")
    await await_for(
        "no pods left",
        lambda: not listed(crds, "pods", "-n", namespace, "-l", "dispatch.dev/job=stopme"),
    )


@pytest.mark.parametrize("point", ["Create:1", "Release:1", "Authorize:2", "Create:2", "Release:2"])
async def test_sigkill_mid_protocol_never_two_released_jobs(
    crds: KubeCluster,
    namespace: str,
    operator: Callable[..., OperatorProcess],
    kubeflow: Kubeflow,
    job_monitor: ReleaseMonitor,
    point: str,
) -> None:
    """The operator SIGKILLed right after a step of the protocol (its test hook), restarted without
    the hook: the seed's history, each submission authorized once, and at no moment two released
    Jobs of the DispatchJob."""
    op = operator("--backend", "job", env={"DISPATCH_TEST_CRASH_AFTER": point})
    await asyncio.to_thread(apply, crds, namespace, manifest("crash", PREEMPTED_ONCE))
    acted: set[str] = set()
    deadline = time.monotonic() + 2 * WAIT
    body: dict[str, Any] = {}
    while time.monotonic() < deadline:
        if not op.running:
            op.start(env={"DISPATCH_TEST_CRASH_AFTER": ""})
        for job in await asyncio.to_thread(jobs, crds, namespace):
            name = job["metadata"]["name"]
            if (
                name in acted
                or not is_released(job)
                or job["metadata"].get("annotations", {}).get("dispatch.dev/ended")
            ):
                continue
            submission = int(job["metadata"]["labels"]["dispatch.dev/submission"])
            running = await kubeflow.wait_workload_pods(namespace, "crash", submission)
            acted.add(name)
            if submission == 1:
                await kubeflow.preempt_pod(namespace, running[0])
            else:
                await kubeflow.exit_pod(namespace, running[0], 0)
        body = await asyncio.to_thread(get_job, crds, namespace, "crash")
        if (body.get("status") or {}).get("settled"):
            break
        await asyncio.sleep(0.3)
    assert (body.get("status") or {}).get("settled"), body.get("status")
    assert op.starts == 2, f"expected one crash at {point}:\n{op.log()[-3000:]}"
    assert history(body) == SEED_HISTORY
    assert [s["n"] for s in body["status"]["submissions"]] == [1, 2]
    job_monitor.assert_held()
    assert job_monitor.max_live.get("crash", 0) <= 1
    canonicals = {s["canonical"].split("/", 1)[1] for s in body["status"]["submissions"]}
    assert job_monitor.released.get("crash", set()) <= canonicals

"""The `job` backend (batch/v1 Job on the workload kit) with the library supervisor, on the lab:
kube-controller-manager's real Job controller, kube-scheduler, kwok as the kubelet.

Library mode: no DispatchJob CRD is needed (``owner=None``: the Jobs carry no ownerReference), and
the records live in a MemoryStore. Covered: preemption by kube-scheduler resubmitted, exit codes
and OOM as causes, the native rule (the Job controller replaces the failed pod itself, once).
Run: ``.venv/bin/pytest -m integration tests/integration/test_job_supervisor.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from kubernetes_asyncio.client import ApiClient

from dispatch import (
    Action,
    CauseKind,
    JobSpec,
    MemoryStore,
    Phase,
    Record,
    RecoveryPolicy,
    Rule,
    State,
    Supervisor,
)
from dispatch._backends.job import JobOptions
from dispatch._backends.job._adapter import JOB, JobBackend
from dispatch._kubeclient import KubeClient, new_client
from dispatch._model import Enforcer, Resources
from tests.support.kube import KubeCluster
from tests.support.lab import Kubeflow
from tests.support.supervised import running, stored

pytestmark = pytest.mark.integration

GUARD = 120.0


@pytest.fixture
async def api(kube_cluster: KubeCluster) -> AsyncIterator[KubeClient]:
    client = await new_client(str(kube_cluster.kubeconfig))
    async with client:
        yield client
    await asyncio.sleep(0.1)


@pytest.fixture
async def backend(api: ApiClient) -> AsyncIterator[JobBackend]:
    made = JobBackend(api, owner=None)
    try:
        yield made
    finally:
        await made.aclose()


async def submit(namespace: str, name: str, rules: tuple[Rule, ...]) -> tuple[str, MemoryStore, Record]:
    job = f"{namespace}/{name}"
    spec = JobSpec(
        name=name,
        command=("python", "train.py"),
        recovery=RecoveryPolicy(rules=rules),
        options={"job": JobOptions(image="example.invalid/train:1", resources=Resources(cpu="1"))},
    )
    store, record = await stored(job, spec, JOB.capabilities)
    return job, store, record


async def test_preemption_by_kube_scheduler_is_resubmitted(
    namespace: str, backend: JobBackend, kubeflow: Kubeflow
) -> None:
    job, store, _ = await submit(namespace, "pre", (Rule(on=(CauseKind.PREEMPTED,), budget=1),))
    supervisor = asyncio.create_task(Supervisor(backend, store).run(job))
    async with asyncio.timeout(GUARD):
        await running(backend, job, f"{namespace}/pre-1")
        (victim,) = await kubeflow.wait_workload_pods(namespace, "pre", 1)
        await kubeflow.preempt_pod(namespace, victim)
        await running(backend, job, f"{namespace}/pre-2")
        (pod,) = await kubeflow.wait_workload_pods(namespace, "pre", 2)
        await kubeflow.exit_pod(namespace, pod, 0)
        record = await supervisor
    assert record.state is State.SUCCEEDED
    assert [(t.from_, t.to, t.submission, t.cause.kind) for t in record.history] == [
        (State.PENDING, State.RECOVERING, 2, CauseKind.PREEMPTED),
        (State.RECOVERING, State.SUCCEEDED, 2, CauseKind.NONE),
    ]
    assert record.submissions[0].cause is not None
    assert (
        "DisruptionTarget" in record.submissions[0].cause.detail
        or "Preempt" in record.submissions[0].cause.detail
    )


@pytest.mark.parametrize(
    ("code", "reason", "kind"),
    [(3, None, CauseKind.NON_ZERO_EXIT), (137, "OOMKilled", CauseKind.OUT_OF_MEMORY)],
    ids=["exit-3", "oom"],
)
async def test_exit_codes_and_oom_are_the_cause(
    namespace: str, backend: JobBackend, kubeflow: Kubeflow, code: int, reason: str | None, kind: CauseKind
) -> None:
    job, store, _ = await submit(namespace, "fail", (Rule(on=(CauseKind.PREEMPTED,), budget=1),))
    supervisor = asyncio.create_task(Supervisor(backend, store).run(job))
    async with asyncio.timeout(GUARD):
        (pod,) = await kubeflow.wait_workload_pods(namespace, "fail", 1)
        await kubeflow.exit_pod(namespace, pod, code, reason=reason)
        record = await supervisor
    assert record.state is State.FAILED
    assert record.cause.kind is kind
    assert record.cause.exit_code == code
    assert len(record.submissions) == 1


async def test_the_native_rule_is_enforced_by_the_job_controller(
    namespace: str, backend: JobBackend, kubeflow: Kubeflow
) -> None:
    """restart on [non-zero-exit out-of-memory] budget 1: planned for the scheduler; the Job
    controller replaces the pod that exited 1 (same Job, no new submission), and the replacement's
    success is the job's. The restart is counted on the record."""
    rule = Rule(on=(CauseKind.NON_ZERO_EXIT, CauseKind.OUT_OF_MEMORY), action=Action.RESTART, budget=1)
    job, store, record = await submit(namespace, "native", (rule,))
    assert record.plan.rules[0].enforcer is Enforcer.SCHEDULER
    supervisor = asyncio.create_task(Supervisor(backend, store).run(job))
    async with asyncio.timeout(GUARD):
        (first,) = await kubeflow.wait_workload_pods(namespace, "native", 1)
        await kubeflow.exit_pod(namespace, first, 1)
        # The Job controller's own backoff (10 s) before it creates the replacement.
        (second,) = await kubeflow.wait_workload_pods(namespace, "native", 1, besides=(first,))
        # The lab saw it running; the kit's watch may show it a moment later: list at each wake.
        expected = [(f"{namespace}/native-1", Phase.RUNNING, 1)]
        woken = asyncio.Event()
        unsubscribe = backend.subscribe(job, woken.set)
        try:
            while True:
                woken.clear()
                if [(v.id, v.phase, v.restarts) for v in await backend.list(job)] == expected:
                    break
                await woken.wait()
        finally:
            unsubscribe()
        await kubeflow.exit_pod(namespace, second, 0)
        record = await supervisor
    assert record.state is State.SUCCEEDED
    assert len(record.submissions) == 1
    assert record.submissions[0].restarts == 1

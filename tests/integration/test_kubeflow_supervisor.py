"""The library supervisor end to end on the lab (real training operator and kube-scheduler):
KubeflowBackend + MemoryStore.

Preemption by kube-scheduler -> resubmission -> success, with the seed's history.
Run: ``.venv/bin/pytest tests/integration/test_kubeflow_supervisor.py``.
"""

from __future__ import annotations

import asyncio

import pytest
from kubernetes_asyncio.client import ApiClient

from dispatch import CauseKind, JobSpec, KubeflowOptions, RecoveryPolicy, Rule, State, Supervisor
from dispatch._backends.kubeflow._adapter import CAPABILITIES, KubeflowBackend
from tests.support.builders import owner_manifest
from tests.support.kube import KubeCluster
from tests.support.lab import Kubeflow
from tests.support.supervised import running, stored

pytestmark = pytest.mark.integration

GUARD = 120.0


async def test_preemption_resubmission_success(
    kube_cluster: KubeCluster, namespace: str, api: ApiClient, kubeflow: Kubeflow
) -> None:
    kube_cluster.apply(owner_manifest(namespace, "finetune"))
    job = f"{namespace}/finetune"
    spec = JobSpec(
        name="finetune",
        command=("torchrun", "train.py"),
        nodes=2,
        recovery=RecoveryPolicy(rules=(Rule(on=(CauseKind.PREEMPTED,), budget=2),)),
        kubeflow=KubeflowOptions(image="example.invalid/train:1"),
    )
    store, _ = await stored(job, spec, CAPABILITIES)
    backend = KubeflowBackend(api)
    try:
        supervisor = asyncio.create_task(Supervisor(backend, store).run(job))
        async with asyncio.timeout(GUARD):
            await running(backend, job, f"{namespace}/finetune-1")
            await kubeflow.wait_pods(namespace, "finetune-1", 2)
            await kubeflow.preempt(namespace, "finetune-1", replica="worker", index=0)
            await running(backend, job, f"{namespace}/finetune-2")
            await kubeflow.wait_pods(namespace, "finetune-2", 2)
            await kubeflow.succeed(namespace, "finetune-2")
            record = await supervisor
    finally:
        await backend.aclose()

    assert record.settled
    assert record.state is State.SUCCEEDED
    assert [(t.from_, t.to, t.submission) for t in record.history] == [
        (State.PENDING, State.RECOVERING, 2),
        (State.RECOVERING, State.SUCCEEDED, 2),
    ]
    assert record.history[0].cause.kind is CauseKind.PREEMPTED
    assert [s.canonical for s in record.submissions] == [f"{namespace}/finetune-1", f"{namespace}/finetune-2"]
    assert record.submissions[0].cause is not None
    assert record.submissions[0].cause.kind is CauseKind.PREEMPTED
    assert record.plan.rules[0].firings == 1

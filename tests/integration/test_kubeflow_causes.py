"""Each cause Kubernetes can produce, through its real mechanism, on the lab (tests/support/lab.py):
the real kube-apiserver, kube-scheduler, kube-controller-manager, training operator v1.9.3 (and its
validating webhook) and kwok. Each is recovered by a rule that covers it, and fails the job with
that cause when no rule does. The library supervisor (KubeflowBackend + MemoryStore) runs the job.

Run: ``.venv/bin/pytest tests/integration/test_kubeflow_causes.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient

from dispatch import (
    Action,
    CauseKind,
    JobSpec,
    KubeflowOptions,
    MemoryStore,
    Phase,
    Record,
    RecoveryPolicy,
    Resources,
    Rule,
    State,
    Supervisor,
)
from dispatch._backends.kubeflow._adapter import CAPABILITIES, KubeflowBackend
from tests.integration.conftest import (
    OperatorProcess,
    apply,
    await_for,
    dispatch_job,
    get_job,
    history,
)
from tests.support.builders import SEED_HISTORY, owner_manifest
from tests.support.kube import KubeCluster
from tests.support.lab import NODE_GPU, UNPULLABLE_IMAGE, Kubeflow
from tests.support.supervised import stored

pytestmark = pytest.mark.integration

GUARD = 150.0
"""Only a guard against a hang (node deletion waits ~60 s for pod GC): no assertion is about time."""


@dataclass
class Run:
    job: str
    name: str
    namespace: str
    store: MemoryStore
    backend: KubeflowBackend
    task: asyncio.Task[Record]

    def pj(self, n: int) -> str:
        return f"{self.name}-{n}"

    async def view(self, n: int, phase: Phase) -> None:
        """Until the adapter shows submission ``n`` in ``phase``."""
        woken = asyncio.Event()
        unsubscribe = self.backend.subscribe(self.job, woken.set)
        try:
            while True:
                woken.clear()
                views = await self.backend.list(self.job)
                if any(v.submission == n and v.phase is phase for v in views):
                    return
                if self.task.done():
                    raise AssertionError(f"the supervisor ended first: {self.task.result()}")
                with_timeout = asyncio.create_task(woken.wait())
                await asyncio.wait(
                    {with_timeout, self.task}, timeout=1.0, return_when=asyncio.FIRST_COMPLETED
                )
                with_timeout.cancel()
        finally:
            unsubscribe()


@pytest.fixture
async def supervise(
    kube_cluster: KubeCluster, namespace: str, api: ApiClient
) -> AsyncIterator[Callable[..., Awaitable[Run]]]:
    runs: list[Run] = []

    async def start(name: str, *rules: Rule, nodes: int = 1, **options: Any) -> Run:
        kube_cluster.apply(owner_manifest(namespace, name))
        job = f"{namespace}/{name}"
        options.setdefault("image", "example.invalid/train:1")
        # Requests, so that kube-scheduler has something to preempt for a pod that needs the node.
        options.setdefault("resources", Resources(cpu="1", memory="1Gi"))
        spec = JobSpec(
            name=name,
            command=("python", "train.py"),
            nodes=nodes,
            recovery=RecoveryPolicy(rules=rules),
            kubeflow=KubeflowOptions(**options),
        )
        store, _ = await stored(job, spec, CAPABILITIES)
        backend = KubeflowBackend(api)
        task = asyncio.create_task(Supervisor(backend, store).run(job))
        run = Run(job, name, namespace, store, backend, task)
        runs.append(run)
        return run

    yield start
    for run in runs:
        run.task.cancel()
        await asyncio.gather(run.task, return_exceptions=True)
        await run.backend.aclose()


async def outcome(run: Run) -> Record:
    async with asyncio.timeout(GUARD):
        return await asyncio.shield(run.task)


def resubmit(*causes: CauseKind, budget: int = 1) -> Rule:
    return Rule(on=causes, budget=budget)


# ---- each mechanism: (what it takes to run, how Kubernetes fails it, the cause) -----------------


async def preempt(kubeflow: Kubeflow, run: Run, n: int) -> None:
    await kubeflow.wait_pods(run.namespace, run.pj(n), 1)
    await kubeflow.preempt(run.namespace, run.pj(n))


async def taint(kubeflow: Kubeflow, run: Run, n: int) -> None:
    await kubeflow.wait_pods(run.namespace, run.pj(n), 1)
    node = await kubeflow.taint_evict(run.namespace, run.pj(n))
    await run.view(n, Phase.ENDED)
    await kubeflow.untaint(node)


async def oom(kubeflow: Kubeflow, run: Run, n: int) -> None:
    await kubeflow.wait_pods(run.namespace, run.pj(n), 1)
    await kubeflow.oom(run.namespace, run.pj(n))


async def exit_1(kubeflow: Kubeflow, run: Run, n: int) -> None:
    await kubeflow.wait_pods(run.namespace, run.pj(n), 1)
    await kubeflow.exit(run.namespace, run.pj(n), 1)


async def deadline(kubeflow: Kubeflow, run: Run, n: int) -> None:
    await kubeflow.wait_pods(run.namespace, run.pj(n), 1)
    await kubeflow.deadline(run.namespace, run.pj(n))


MECHANISMS: dict[str, tuple[CauseKind, Callable[[Kubeflow, Run, int], Awaitable[None]]]] = {
    "kube-scheduler-preemption": (CauseKind.PREEMPTED, preempt),
    "noexecute-taint-eviction": (CauseKind.NODE_LOST, taint),
    "oomkilled": (CauseKind.OUT_OF_MEMORY, oom),
    "exit-1": (CauseKind.NON_ZERO_EXIT, exit_1),
    "active-deadline": (CauseKind.TIME_LIMIT, deadline),
}


@pytest.mark.parametrize("mechanism", sorted(MECHANISMS))
async def test_covered_cause_is_recovered(
    supervise: Callable[..., Awaitable[Run]], kubeflow: Kubeflow, mechanism: str
) -> None:
    kind, fail = MECHANISMS[mechanism]
    run = await supervise(f"rec-{mechanism[:20]}", resubmit(kind))
    async with asyncio.timeout(GUARD):
        await fail(kubeflow, run, 1)
        await kubeflow.wait_pods(run.namespace, run.pj(2), 1)
        await kubeflow.succeed(run.namespace, run.pj(2))
    record = await outcome(run)
    assert record.state is State.SUCCEEDED
    assert record.settled
    first = record.submissions[0].cause
    assert first is not None
    assert first.kind is kind, first
    assert record.history[0].to is State.RECOVERING
    assert record.plan.rules[0].firings == 1


@pytest.mark.parametrize("mechanism", sorted(MECHANISMS))
async def test_uncovered_cause_fails_the_job_with_it(
    supervise: Callable[..., Awaitable[Run]], kubeflow: Kubeflow, mechanism: str
) -> None:
    kind, fail = MECHANISMS[mechanism]
    # A rule for some other cause, so the plan has rules and this cause is uncovered.
    other = CauseKind.NO_CAPACITY if kind is not CauseKind.NO_CAPACITY else CauseKind.PREEMPTED
    run = await supervise(f"unc-{mechanism[:20]}", resubmit(other))
    async with asyncio.timeout(GUARD):
        await fail(kubeflow, run, 1)
    record = await outcome(run)
    assert record.state is State.FAILED
    assert record.cause.kind is kind, record.cause
    assert len(record.submissions) == 1


async def test_node_deleted_pod_gc_is_node_lost(
    supervise: Callable[..., Awaitable[Run]], kubeflow: Kubeflow
) -> None:
    """The Node object deleted: pod GC force-deletes the pod (DisruptionTarget DeletionByPodGC)."""
    run = await supervise("node-deleted", resubmit(CauseKind.PREEMPTED))
    async with asyncio.timeout(GUARD):
        await kubeflow.wait_pods(run.namespace, run.pj(1), 1)
        await kubeflow.delete_node(run.namespace, run.pj(1))
    record = await outcome(run)
    assert record.state is State.FAILED
    assert record.cause.kind is CauseKind.NODE_LOST, record.cause


async def test_node_not_ready_is_node_lost(
    supervise: Callable[..., Awaitable[Run]], kubeflow: Kubeflow
) -> None:
    """The node stops heartbeating: node-lifecycle taints it unreachable and its pods are evicted."""
    run = await supervise("node-not-ready", resubmit(CauseKind.NODE_LOST))
    async with asyncio.timeout(GUARD):
        await kubeflow.wait_pods(run.namespace, run.pj(1), 1)
        node = await kubeflow.node_not_ready(run.namespace, run.pj(1))
        await run.view(1, Phase.ENDED)
        await kubeflow.node_ready(node)
        await kubeflow.wait_pods(run.namespace, run.pj(2), 1)
        await kubeflow.succeed(run.namespace, run.pj(2))
    record = await outcome(run)
    assert record.state is State.SUCCEEDED
    first = record.submissions[0].cause
    assert first is not None
    assert first.kind is CauseKind.NODE_LOST, first


async def test_image_that_never_pulls_is_launch_failed(supervise: Callable[..., Awaitable[Run]]) -> None:
    run = await supervise("no-pull", resubmit(CauseKind.PREEMPTED), image=UNPULLABLE_IMAGE)
    record = await outcome(run)
    assert record.state is State.FAILED
    assert record.cause.kind is CauseKind.LAUNCH_FAILED
    assert "ErrImagePull" in record.cause.detail


async def test_unschedulable_beyond_the_wait_is_no_capacity(supervise: Callable[..., Awaitable[Run]]) -> None:
    run = await supervise(
        "too-big",
        resubmit(CauseKind.PREEMPTED),
        resources=Resources(gpu=NODE_GPU + 1),
        no_capacity_after_seconds=2,
    )
    record = await outcome(run)
    assert record.state is State.FAILED
    assert record.cause.kind is CauseKind.NO_CAPACITY
    assert "Insufficient nvidia.com/gpu" in record.cause.detail


async def test_unschedulable_recovered_by_a_resubmission(
    supervise: Callable[..., Awaitable[Run]], kubeflow: Kubeflow
) -> None:
    run = await supervise(
        "too-big-then-room",
        resubmit(CauseKind.NO_CAPACITY),
        resources=Resources(gpu=NODE_GPU + 1),
        no_capacity_after_seconds=2,
    )
    async with asyncio.timeout(GUARD):
        await run.view(1, Phase.ENDED)
        await kubeflow.add_node(gpu=2 * NODE_GPU)
        await kubeflow.wait_pods(run.namespace, run.pj(2), 1)
        await kubeflow.succeed(run.namespace, run.pj(2))
    record = await outcome(run)
    assert record.state is State.SUCCEEDED
    first = record.submissions[0].cause
    assert first is not None
    assert first.kind is CauseKind.NO_CAPACITY


@pytest.mark.parametrize(
    ("name", "options", "word"),
    [
        # The training operator's validating webhook refuses a name that is not a DNS-1035 label.
        ("1-digit-first", {}, "denied the request"),
        # Over the API server's object size limit (env is copied into every replica's template).
        ("too-large", {"env": {f"V{i}": "x" * 30000 for i in range(60)}}, "bytes"),
    ],
)
async def test_objects_that_can_never_start_fail_at_once(
    supervise: Callable[..., Awaitable[Run]], name: str, options: dict[str, Any], word: str
) -> None:
    run = await supervise(name, resubmit(CauseKind.PREEMPTED), **options)
    record = await outcome(run)
    assert record.state is State.FAILED
    assert record.settled
    assert record.cause.kind is CauseKind.LAUNCH_FAILED
    assert word in record.cause.detail, record.cause.detail


async def test_restart_budget_belongs_to_the_job_across_submissions(
    supervise: Callable[..., Awaitable[Run]], kubeflow: Kubeflow, kube_cluster: KubeCluster
) -> None:
    """A scheduler-enforced restart rule (budget 2: OnFailure, backoffLimit 3) fires once in
    submission 1; a preemption then resubmits: submission 2 may restart only what is left (1)."""
    run = await supervise(
        "budget",
        Rule(on=(CauseKind.NON_ZERO_EXIT, CauseKind.OUT_OF_MEMORY), action=Action.RESTART, budget=2),
        resubmit(CauseKind.PREEMPTED),
    )
    async with asyncio.timeout(GUARD):
        await kubeflow.wait_pods(run.namespace, run.pj(1), 1)
        await kubeflow.oom(run.namespace, run.pj(1))

        async def fired() -> bool:
            return (await run.store.get(run.job)).record.plan.rules[0].firings >= 1

        await await_for("the in-place restart recorded as a firing", fired)
        await kubeflow.preempt(run.namespace, run.pj(1))
        await kubeflow.wait_pods(run.namespace, run.pj(2), 1)
        second = kube_cluster.get("pytorchjob", run.pj(2), run.namespace)
        assert second["spec"]["runPolicy"]["backoffLimit"] == 2  # 1 left, + 1 (see _pytorchjob.py)
        await kubeflow.succeed(run.namespace, run.pj(2))
    record = await outcome(run)
    assert record.state is State.SUCCEEDED
    assert record.plan.rules[0].firings == 1
    assert record.plan.rules[1].firings == 1


async def test_onfailure_preemption_is_stopped_not_recreated_unbounded(
    supervise: Callable[..., Awaitable[Run]], kubeflow: Kubeflow, kube_cluster: KubeCluster
) -> None:
    """Under OnFailure the training operator recreates a preempted pod by itself, uncounted; the
    adapter stops the PyTorchJob on a cause the restart rule does not cover, so the only restarts
    are the rule's and the preemption goes to the supervisor."""
    run = await supervise(
        "onfailure-preempt",
        Rule(on=(CauseKind.NON_ZERO_EXIT, CauseKind.OUT_OF_MEMORY), action=Action.RESTART, budget=2),
    )
    async with asyncio.timeout(GUARD):
        await kubeflow.wait_pods(run.namespace, run.pj(1), 1)
        await kubeflow.preempt(run.namespace, run.pj(1))
    record = await outcome(run)
    assert record.state is State.FAILED
    assert record.cause.kind is CauseKind.PREEMPTED
    body = kube_cluster.get("pytorchjob", run.pj(1), run.namespace)
    assert body["spec"]["runPolicy"]["suspend"] is True
    assert '"preempted"' in body["metadata"]["annotations"]["dispatch.dev/ended"]

    async def no_pod_runs() -> bool:
        pods = await kubeflow.pods(run.namespace, run.pj(1))
        return not [p for p in pods if p["status"].get("phase") in ("Running", "Pending")]

    await await_for("the training operator to delete the suspended job's pods, and create none", no_pod_runs)


async def test_settled_only_once_every_pod_has_stopped(
    supervise: Callable[..., Awaitable[Run]], kubeflow: Kubeflow
) -> None:
    """The training operator fails the job when its master is preempted and deletes the running
    worker (cleanPodPolicy Running), which takes its grace period to stop: the job is recorded
    failed at once but settled only once the worker no longer runs."""
    run = await supervise("settle-late", resubmit(CauseKind.NO_CAPACITY), nodes=2)
    async with asyncio.timeout(GUARD):
        await kubeflow.wait_pods(run.namespace, run.pj(1), 2)
        worker = f"{run.pj(1)}-worker-0"
        await asyncio.to_thread(
            kubeflow.lab.annotate_pod, run.namespace, worker, {"lab.dispatch.io/termination-delay": "8s"}
        )
        await kubeflow.preempt(run.namespace, run.pj(1))

        async def failed() -> bool:
            return (await run.store.get(run.job)).record.state is State.FAILED

        await await_for("the outcome", failed)
        assert not (await run.store.get(run.job)).record.settled  # the worker still runs
    record = await outcome(run)
    assert record.settled
    assert record.cause.kind is CauseKind.PREEMPTED
    pod = await asyncio.to_thread(kubeflow.lab.pod, run.namespace, worker)
    assert pod is None or pod["status"].get("phase") in ("Succeeded", "Failed")


# ---- the operator process killed while Kubernetes preempts -------------------------------------


@pytest.mark.parametrize("policy", ["never", "onfailure"])
async def test_preemption_while_the_operator_is_killed_is_still_preempted(
    crds: KubeCluster,
    namespace: str,
    operator: Callable[..., OperatorProcess],
    kubeflow: Kubeflow,
    policy: str,
) -> None:
    """kill -9 of the operator, then a real preemption; the victim is deleted before the operator
    comes back. Under Never the training operator fails the PyTorchJob ("1 Master replica(s)
    failed"), under OnFailure it recreates the pod by itself: either way the restarted operator
    finds the scheduler's Preempted event and records preempted, never unknown."""
    rules: list[dict[str, Any]] = [{"on": ["preempted"], "budget": 1}]
    if policy == "onfailure":
        rules.append({"on": ["non-zero-exit", "out-of-memory"], "action": "restart", "budget": 2})
    op = operator()
    await asyncio.to_thread(apply, crds, namespace, dispatch_job("downtime", nodes=1, rules=rules))
    async with asyncio.timeout(GUARD):
        pods = await kubeflow.wait_pods(namespace, "downtime-1", 1)
        victim = pods[0]["metadata"]
        op.kill()
        await kubeflow.preempt(namespace, "downtime-1")
        await kubeflow.wait_pod_gone(namespace, victim["name"], victim["uid"])
        if policy == "onfailure":
            await kubeflow.wait_pods(namespace, "downtime-1", 1)  # recreated by the training operator
        op.start()
        await kubeflow.wait_pods(namespace, "downtime-2", 1)
        await kubeflow.succeed(namespace, "downtime-2")

        def settled() -> dict[str, Any] | None:
            body = get_job(crds, namespace, "downtime")
            return body if (body.get("status") or {}).get("settled") else None

        body = await await_for("the job to settle", settled, within=GUARD)
    assert history(body) == SEED_HISTORY
    first = body["status"]["submissions"][0]["cause"]
    assert "Preempted" in first["detail"], first


async def test_pod_deleted_on_a_not_ready_node_is_node_lost(
    supervise: Callable[..., Awaitable[Run]], kubeflow: Kubeflow
) -> None:
    """The node stops heartbeating; as soon as node-lifecycle marks it NotReady someone deletes the
    pod: no DisruptionTarget, and no kubelet will confirm the deletion. Without a rule for node-lost
    the job fails with node-lost (not unknown), and settles although the pod never terminates."""
    run = await supervise("notready-deleted", resubmit(CauseKind.PREEMPTED))
    async with asyncio.timeout(GUARD):
        await kubeflow.wait_pods(run.namespace, run.pj(1), 1)
        node = await kubeflow.node_not_ready(run.namespace, run.pj(1))

        def not_ready() -> bool:
            body = kubeflow.lab.node(node) or {}
            return not any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in body.get("status", {}).get("conditions") or []
            )

        await await_for("the node to be NotReady", not_ready, within=GUARD)
        await kubeflow.delete_pod(run.namespace, f"{run.pj(1)}-master-0")
    record = await outcome(run)
    assert record.state is State.FAILED
    assert record.cause.kind is CauseKind.NODE_LOST, record.cause
    assert record.settled

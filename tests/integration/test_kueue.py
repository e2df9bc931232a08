"""Kueue in front of dispatch: DispatchJobs with ``spec.queue`` on the lab with the real
Kueue v0.17.0 (the ``kueue`` lab extra) and the real training operator, JobSet and Trainer.

Each test has its own two ClusterQueues in a cohort of its own (``tests.support.kueue``: cpu 2 and
memory 8Gi each, the first without borrowing) and a LocalQueue for each in its namespace. A job of
2 pods (cpu 1 each) fills its queue; a plain batch/v1 Job of WorkloadPriorityClass ``high`` that
needs cpu 2 in the same LocalQueue is a real Kueue preemption (``withinClusterQueue:
LowerPriority``). Every test watches the namespace's objects of its kind and checks at every
event that no DispatchJob ever has two running (unsuspended, not ended) objects.

What is proven, as the issue asks: admitted and run through Kueue (dispatch never unsuspends: the
field's owner is Kueue); a Kueue preemption recovered by a ``preempted`` rule with the history
semantics.md gives; a budget spent by repeated Kueue preemptions ends failed/preempted and nothing
of the job runs again (Kueue's own requeue stopped); quota that never frees ends ``no-capacity``
after the job's own wait; an administrator's ``spec.active=false`` is a cancel outside dispatch;
the operator SIGKILLed while Kueue admits and while it evicts leaves one record; and the same
admission and preemption for the job, jobset and trainjob backends (behaviour 5).
Run: ``.venv/bin/pytest -m "integration and kueue" tests/integration/test_kueue.py``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pytest

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
from tests.support.builders import SEED_HISTORY, lab_manifest
from tests.support.kube import KubeCluster
from tests.support.kueue import (
    HIGH,
    LOW,
    PRIORITY_LABEL,
    QUEUE_LABEL,
    Queues,
    batch_job,
    deactivate,
    is_true,
    workload_of,
    workloads,
)
from tests.support.lab import Kubeflow, Lab

pytestmark = [pytest.mark.integration, pytest.mark.kueue]

IMAGE = "example.invalid/train:1"
DISPATCH_MANAGER = "dispatch-operator"
"""dispatch's field manager (dispatch._kubeclient.FIELD_MANAGER)."""


@dataclass(frozen=True)
class Kind:
    backend: str
    resource: tuple[str, str, str]
    container: str
    finished: tuple[str, ...]
    extras: tuple[str, ...] = ()

    @property
    def plural(self) -> str:
        return f"{self.resource[2]}.{self.resource[0]}"

    def suspended(self, obj: Mapping[str, Any]) -> bool:
        spec = obj.get("spec") or {}
        return bool(
            (spec.get("runPolicy") or {}).get("suspend")
            if self.backend == "kubeflow"
            else spec.get("suspend")
        )

    def suspend_path(self) -> tuple[str, ...]:
        return (
            ("f:spec", "f:runPolicy", "f:suspend") if self.backend == "kubeflow" else ("f:spec", "f:suspend")
        )


PYTORCHJOB = Kind("kubeflow", ("kubeflow.org", "v1", "pytorchjobs"), "pytorch", ("Succeeded", "Failed"))
JOB = Kind("job", ("batch", "v1", "jobs"), "main", ("Complete", "Failed"))
JOBSET = Kind(
    "jobset", ("jobset.x-k8s.io", "v1alpha2", "jobsets"), "main", ("Completed", "Failed"), ("jobset",)
)
TRAINJOB = Kind(
    "trainjob",
    ("trainer.kubeflow.org", "v1alpha1", "trainjobs"),
    "node",
    ("Complete", "Failed"),
    ("trainer",),
)
OTHER_KINDS = [
    pytest.param(JOB, id="job"),
    pytest.param(JOBSET, id="jobset"),
    pytest.param(
        TRAINJOB,
        id="trainjob",
        marks=pytest.mark.trainer,
    ),
]


def manifest(
    kind: Kind,
    name: str,
    queue: str,
    *,
    rules: list[dict[str, Any]],
    priority: str = LOW,
    nodes: int = 2,
    options: Mapping[str, Any] | None = None,
) -> str:
    """A DispatchJob as a user writes it for a queue: ``spec.queue`` and ``spec.workloadPriorityClass``."""
    return lab_manifest(
        kind.backend, name, rules, options=options, nodes=nodes, queue=queue, workloadPriorityClass=priority
    )


def objects(cluster: KubeCluster, kind: Kind, namespace: str, job: str | None = None) -> list[dict[str, Any]]:
    out = json.loads(cluster.kubectl("get", kind.plural, "-n", namespace, "-o", "json"))
    items = [
        o
        for o in out["items"]
        if job is None or (o["metadata"].get("labels") or {}).get("dispatch.dev/job") == job
    ]
    return sorted(items, key=lambda o: str(o["metadata"]["name"]))


def submission(obj: Mapping[str, Any]) -> int:
    return int((obj["metadata"].get("labels") or {}).get("dispatch.dev/submission") or 0)


def ended(kind: Kind, obj: Mapping[str, Any]) -> bool:
    meta = obj["metadata"]
    if meta.get("deletionTimestamp") or (meta.get("annotations") or {}).get("dispatch.dev/ended"):
        return True
    return any(
        c.get("type") in kind.finished and c.get("status") == "True"
        for c in (obj.get("status") or {}).get("conditions") or ()
    )


@pytest.fixture
async def monitor(
    crds: KubeCluster, namespace: str, request: pytest.FixtureRequest
) -> AsyncIterator[ReleaseMonitor]:
    """Every state of every object of the test's kind in the namespace (its ``kind`` parameter,
    PyTorchJob by default): never two running (unsuspended, not ended) at once per DispatchJob."""
    params = getattr(request.node, "callspec", None)
    kind: Kind = params.params.get("kind", PYTORCHJOB) if params is not None else PYTORCHJOB
    watcher = ReleaseMonitor(suspended=kind.suspended, finished=kind.finished)
    async with follow_releases(crds, namespace, kind.resource, watcher) as followed:
        yield followed
    # More turns of the loop than follow_releases gives: under load the watch's TLS transport may
    # still be closing, and its ResourceWarning would fail the next test's setup.
    await asyncio.sleep(1.0)
    followed.assert_held()


@pytest.fixture
def kind_lab(lab: Lab, request: pytest.FixtureRequest) -> Lab:
    """The lab with what the test's kind needs (JobSet, Trainer: see tests.support.lab)."""
    params = getattr(request.node, "callspec", None)
    kind: Kind = params.params.get("kind", PYTORCHJOB) if params is not None else PYTORCHJOB
    if kind.extras:
        lab.start_extras(kind.extras)  # restarts Kueue so that it manages the new kind
    return lab


async def admitted(
    cluster: KubeCluster, kind: Kind, namespace: str, job: str, n: int, kubeflow: Kubeflow, pods: int = 2
) -> dict[str, Any]:
    """Submission ``n`` of ``job`` once Kueue has unsuspended it and its pods run (the body as the
    API serves it, managedFields included)."""

    def probe() -> dict[str, Any] | None:
        for obj in objects(cluster, kind, namespace, job):
            if submission(obj) == n and not kind.suspended(obj) and not ended(kind, obj):
                return obj
        return None

    found: dict[str, Any] = await await_for(f"{job} submission {n} admitted and unsuspended", probe)
    await asyncio.wait_for(kubeflow.wait_workload_pods(namespace, job, n, pods), WAIT)
    group, version, plural = kind.resource
    path = f"/apis/{group}/{version}/namespaces/{namespace}/{plural}/{found['metadata']['name']}"
    raw: dict[str, Any] = await asyncio.to_thread(kubeflow.lab.request, "GET", path)  # with managedFields
    return raw


async def run_to_success(
    kubeflow: Kubeflow, kind: Kind, namespace: str, job: str, n: int, pods: int = 2
) -> None:
    """Every container of submission ``n`` exits 0 (a PyTorchJob's master last)."""
    names = await asyncio.wait_for(kubeflow.wait_workload_pods(namespace, job, n, pods), WAIT)
    for pod in sorted(names, key=lambda p: "-master-" in p):
        await kubeflow.exit_pod(namespace, pod, 0, container=kind.container)


def preemptor(cluster: KubeCluster, queues: Queues, name: str) -> None:
    """A batch/v1 Job of priority high needing the whole quota of the test's LocalQueue."""
    cluster.apply(batch_job(queues.namespace, name, queues.queue, cpu="2", priority=HIGH))


def done_preempting(cluster: KubeCluster, namespace: str, name: str) -> None:
    """The preemptor Job goes (its pods with it): its quota is free again."""
    cluster.kubectl("delete", "job", name, "-n", namespace, "--wait=false", "--cascade=background")


def submissions(cluster: KubeCluster, namespace: str, job: str) -> int:
    return len((get_job(cluster, namespace, job).get("status") or {}).get("submissions") or ())


async def preempted(
    cluster: KubeCluster, kind: Kind, queues: Queues, job: str, n: int, kubeflow: Kubeflow, urgent: str
) -> dict[str, Any]:
    """Submission ``n`` runs, then the preemptor ``urgent`` comes: Kueue evicts ``n`` (Preempted,
    InClusterQueue). Returns the preempted object."""
    obj = await admitted(cluster, kind, queues.namespace, job, n, kubeflow)
    await asyncio.to_thread(preemptor, cluster, queues, urgent)
    return obj


async def resubmitted(cluster: KubeCluster, queues: Queues, job: str, n: int, urgent: str) -> None:
    """Until dispatch has recorded submission ``n`` (released into the queue, where it waits while
    ``urgent`` runs); then ``urgent`` goes, and its quota with it."""
    await await_for(
        f"{job} submission {n} recorded", lambda: submissions(cluster, queues.namespace, job) >= n
    )
    await asyncio.to_thread(done_preempting, cluster, queues.namespace, urgent)


async def recovered_once(
    cluster: KubeCluster, kind: Kind, queues: Queues, job: str, kubeflow: Kubeflow
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One Kueue preemption of submission 1, recovered by submission 2, which runs to success:
    the preempted object and the settled DispatchJob."""
    first = await preempted(cluster, kind, queues, job, 1, kubeflow, "urgent")
    await resubmitted(cluster, queues, job, 2, "urgent")
    await admitted(cluster, kind, queues.namespace, job, 2, kubeflow)
    await run_to_success(kubeflow, kind, queues.namespace, job, 2)
    return first, await settled(cluster, queues.namespace, job)


def workload_for(cluster: KubeCluster, namespace: str, obj: Mapping[str, Any]) -> dict[str, Any] | None:
    return workload_of(workloads(cluster, namespace), str(obj["metadata"]["uid"]))


def suspend_owners(kind: Kind, body: Mapping[str, Any]) -> list[str]:
    """The field managers that own the object's suspend field (``body`` as the API serves it,
    with its managedFields)."""
    owners = []
    for entry in body["metadata"].get("managedFields") or ():
        fields: Any = entry.get("fieldsV1") or {}
        for step in kind.suspend_path():
            fields = fields.get(step) if isinstance(fields, dict) else None
        if fields is not None:
            owners.append(str(entry.get("manager")))
    return owners


async def never_admitted_again(cluster: KubeCluster, kind: Kind, namespace: str, job: str) -> None:
    """For a while (Kueue's requeue backoff is 5 s in the lab): nothing of ``job`` runs, and no
    Workload of its objects holds quota."""
    for _ in range(15):
        await asyncio.sleep(1)
        objs = await asyncio.to_thread(objects, cluster, kind, namespace, job)
        running = [o["metadata"]["name"] for o in objs if not kind.suspended(o) and not ended(kind, o)]
        assert not running, f"{job}: {running} running again after the job ended"
        wls = await asyncio.to_thread(workloads, cluster, namespace)
        uids = {o["metadata"]["uid"] for o in objs}
        holding = [
            w["metadata"]["name"]
            for w in wls
            if any(r.get("uid") in uids for r in w["metadata"].get("ownerReferences") or ())
            and is_true(w, "QuotaReserved")
            and not is_true(w, "Finished")
        ]
        assert not holding, f"{job}: Workloads {holding} admitted again after the job ended"


@dataclass(frozen=True)
class Kueued:
    """What every test here uses: the cluster, its namespace and queues, the operator factory,
    the lab's mechanisms and the monitor of the test's kind."""

    crds: KubeCluster
    namespace: str
    operator: Callable[..., OperatorProcess]
    kubeflow: Kubeflow
    queues: Queues
    monitor: ReleaseMonitor


@pytest.fixture
def k(
    crds: KubeCluster,
    namespace: str,
    operator: Callable[..., OperatorProcess],
    kubeflow: Kubeflow,
    queues: Queues,
    monitor: ReleaseMonitor,
) -> Kueued:
    return Kueued(crds, namespace, operator, kubeflow, queues, monitor)


# ---- 1. admitted and run to success ------------------------------------------------------------


async def test_a_queued_job_is_admitted_by_kueue_and_runs_to_success(k: Kueued) -> None:
    k.operator()
    await asyncio.to_thread(
        apply, k.crds, k.namespace, manifest(PYTORCHJOB, "queued", k.queues.queue, rules=[])
    )
    obj = await admitted(k.crds, PYTORCHJOB, k.namespace, "queued", 1, k.kubeflow)
    assert obj["metadata"]["labels"][QUEUE_LABEL] == k.queues.queue
    wl = await asyncio.to_thread(workload_for, k.crds, k.namespace, obj)
    assert wl is not None
    assert is_true(wl, "Admitted"), wl
    assert wl["status"]["admission"]["clusterQueue"] == k.queues.cluster_queue
    # Kueue unsuspended it, not dispatch: the suspend field's owner is Kueue's manager.
    owners = suspend_owners(PYTORCHJOB, obj)
    assert owners
    assert DISPATCH_MANAGER not in owners, owners
    await run_to_success(k.kubeflow, PYTORCHJOB, k.namespace, "queued", 1)
    body = await settled(k.crds, k.namespace, "queued")
    assert body["status"]["state"] == "succeeded"
    assert [s["n"] for s in body["status"]["submissions"]] == [1]
    assert history(body) == [("pending", "succeeded", 1, "none")]


# ---- 2. a Kueue preemption recovered -----------------------------------------------------------


async def test_a_kueue_preemption_is_recovered_by_a_preempted_rule(k: Kueued) -> None:
    k.operator()
    rules = [{"on": ["preempted"], "budget": 2}]
    await asyncio.to_thread(
        apply, k.crds, k.namespace, manifest(PYTORCHJOB, "victim", k.queues.queue, rules=rules)
    )
    first, body = await recovered_once(k.crds, PYTORCHJOB, k.queues, "victim", k.kubeflow)
    assert history(body) == SEED_HISTORY
    assert body["status"]["plan"]["rules"][0]["firings"] == 1
    # dispatch ended the preempted object (deleting it deletes its Workload: Kueue's requeue stops).
    left = await asyncio.to_thread(objects, k.crds, PYTORCHJOB, k.namespace, "victim")
    assert all(ended(PYTORCHJOB, o) for o in left if o["metadata"]["uid"] == first["metadata"]["uid"]), left
    assert k.monitor.max_live["victim"] == 1


@pytest.mark.parametrize("kind", [pytest.param(PYTORCHJOB, id="kubeflow"), *OTHER_KINDS])
async def test_a_preempted_job_moves_to_the_queue_and_priority_its_rule_names(
    kind: Kind, kind_lab: Lab, k: Kueued
) -> None:
    """A rule's change, for each kind: submission 1 runs in the test's first LocalQueue at priority
    low and is preempted there; submission 2 is released into the other LocalQueue at priority
    high (a cohort's other ClusterQueue admits it while the preemptor still holds the first), and
    the record says what changed."""
    k.operator("--backend", kind.backend)
    change = {"queue": k.queues.other_queue, "workloadPriorityClass": HIGH}
    rules = [{"on": ["preempted"], "budget": 1, "change": change}]
    await asyncio.to_thread(apply, k.crds, k.namespace, manifest(kind, "moves", k.queues.queue, rules=rules))
    first = await preempted(k.crds, kind, k.queues, "moves", 1, k.kubeflow, "urgent")
    assert first["metadata"]["labels"][QUEUE_LABEL] == k.queues.queue
    second = await admitted(k.crds, kind, k.namespace, "moves", 2, k.kubeflow)
    labels = second["metadata"]["labels"]
    assert (labels[QUEUE_LABEL], labels[PRIORITY_LABEL]) == (k.queues.other_queue, HIGH)
    wl = await asyncio.to_thread(workload_for, k.crds, k.namespace, second)
    assert wl is not None
    assert wl["status"]["admission"]["clusterQueue"] == k.queues.other_cluster_queue
    await run_to_success(k.kubeflow, kind, k.namespace, "moves", 2)
    body = await settled(k.crds, k.namespace, "moves")
    await asyncio.to_thread(done_preempting, k.crds, k.namespace, "urgent")
    assert history(body) == SEED_HISTORY
    assert body["status"]["submissions"][1]["changes"] == [
        {"field": "spec.queue", "from": k.queues.queue, "to": k.queues.other_queue},
        {"field": "spec.workloadPriorityClass", "from": LOW, "to": HIGH},
    ]
    assert body["status"]["plan"]["rules"][0]["change"] == (
        f"queue {k.queues.other_queue}; workloadPriorityClass {HIGH}"
    )
    assert k.monitor.max_live["moves"] == 1


# ---- 3. the budget spent by Kueue preemptions ---------------------------------------------------


async def test_a_budget_spent_by_kueue_preemptions_fails_the_job_and_nothing_runs_again(k: Kueued) -> None:
    k.operator()
    rules = [{"on": ["preempted"], "budget": 1}]
    await asyncio.to_thread(
        apply, k.crds, k.namespace, manifest(PYTORCHJOB, "twice", k.queues.queue, rules=rules)
    )
    await preempted(k.crds, PYTORCHJOB, k.queues, "twice", 1, k.kubeflow, "urgent-1")
    await resubmitted(k.crds, k.queues, "twice", 2, "urgent-1")
    await preempted(k.crds, PYTORCHJOB, k.queues, "twice", 2, k.kubeflow, "urgent-2")
    body = await settled(k.crds, k.namespace, "twice")
    assert body["status"]["state"] == "failed"
    assert body["status"]["cause"]["kind"] == "preempted"
    assert history(body) == [
        ("pending", "recovering", 2, "preempted"),
        ("recovering", "failed", 2, "preempted"),
    ]
    # The quota frees up: Kueue would requeue and admit an evicted Workload by itself.
    await asyncio.to_thread(done_preempting, k.crds, k.namespace, "urgent-2")
    await never_admitted_again(k.crds, PYTORCHJOB, k.namespace, "twice")
    assert k.monitor.max_live["twice"] == 1


# ---- 4. quota that never frees up ---------------------------------------------------------------


@pytest.mark.parametrize("queues", [{"cpu": "1"}], indirect=True, ids=["cpu-1"])
async def test_quota_that_never_frees_up_ends_no_capacity_after_the_jobs_wait(k: Kueued) -> None:
    k.operator()
    text = manifest(
        PYTORCHJOB,
        "starved",
        k.queues.queue,
        rules=[{"on": ["preempted"], "budget": 1}],
        options={"noCapacityAfterSeconds": 20},
    )
    await asyncio.to_thread(apply, k.crds, k.namespace, text)

    def waiting() -> str | None:
        status = get_job(k.crds, k.namespace, "starved").get("status") or {}
        note = status.get("observedNote")
        return str(note) if note and not status.get("settled") else None

    # Waiting for quota is not a failure: pending, with a note that names the queue.
    note = await await_for("a note that it waits for Kueue", waiting)
    assert k.queues.queue in note, note
    body = await settled(k.crds, k.namespace, "starved")
    # Queued by dispatch's own release: not held outside dispatch, so no HeldOutside Warning.
    items = json.loads(k.crds.kubectl("get", "events", "-n", k.namespace, "-o", "json"))["items"]
    assert [
        e for e in items if e["involvedObject"]["name"] == "starved" and e["reason"] == "HeldOutside"
    ] == []
    assert body["status"]["state"] == "failed"
    assert body["status"]["cause"]["kind"] == "no-capacity"
    assert history(body) == [("pending", "failed", 1, "no-capacity")]
    await never_admitted_again(k.crds, PYTORCHJOB, k.namespace, "starved")


@pytest.mark.parametrize("queues", [{"memory": "1000Gi"}], indirect=True, ids=["memory-1000Gi"])
async def test_kueues_pods_ready_timeout_on_unschedulable_pods_is_no_capacity(k: Kueued) -> None:
    """Kueue admits it (its quota holds 1000Gi) but no node has 300Gi: kube-scheduler leaves the
    pods Unschedulable, and Kueue's PodsReady timeout (30 s in the lab) comes long before the job's
    own wait (600 s): the cause is no-capacity, from Kueue's eviction."""
    k.operator()
    text = manifest(
        PYTORCHJOB,
        "too-big",
        k.queues.queue,
        rules=[],
        options={"resources": {"cpu": "1", "memory": "300Gi"}, "noCapacityAfterSeconds": 600},
    )
    await asyncio.to_thread(apply, k.crds, k.namespace, text)
    body = await settled(k.crds, k.namespace, "too-big")
    assert body["status"]["state"] == "failed"
    assert body["status"]["cause"]["kind"] == "no-capacity"
    assert "PodsReady" in body["status"]["cause"]["detail"], body["status"]["cause"]
    assert history(body) == [("pending", "failed", 1, "no-capacity")]
    await never_admitted_again(k.crds, PYTORCHJOB, k.namespace, "too-big")


# ---- 5. an administrator deactivates the Workload ------------------------------------------------


async def test_a_workload_deactivated_by_an_administrator_is_cancelled_outside_dispatch(k: Kueued) -> None:
    k.operator()
    rules = [{"on": ["preempted"], "budget": 2}]
    await asyncio.to_thread(
        apply, k.crds, k.namespace, manifest(PYTORCHJOB, "stopped", k.queues.queue, rules=rules)
    )
    obj = await admitted(k.crds, PYTORCHJOB, k.namespace, "stopped", 1, k.kubeflow)
    wl = await asyncio.to_thread(workload_for, k.crds, k.namespace, obj)
    assert wl is not None
    await asyncio.to_thread(deactivate, k.crds, k.namespace, wl["metadata"]["name"])
    body = await settled(k.crds, k.namespace, "stopped")
    status = body["status"]
    assert status["state"] == "cancelled"
    assert [h[:3] for h in history(body)] == [("pending", "cancelled", 1)]
    assert status["history"][-1]["actor"]["kind"] == "scheduler"
    assert [s["n"] for s in status["submissions"]] == [1]
    await never_admitted_again(k.crds, PYTORCHJOB, k.namespace, "stopped")


# ---- 6. the operator SIGKILLed while Kueue admits or evicts ---------------------------------------


async def test_the_operator_killed_right_after_the_release_while_kueue_admits(k: Kueued) -> None:
    """SIGKILL right after the release (the queue label) landed: Kueue admits and unsuspends the
    object while no operator runs; the restarted operator adopts that run, makes no second one."""
    crashing = k.operator(env={"DISPATCH_TEST_CRASH_AFTER": "Release:1"})
    await asyncio.to_thread(
        apply, k.crds, k.namespace, manifest(PYTORCHJOB, "adopted", k.queues.queue, rules=[])
    )
    assert await asyncio.to_thread(crashing.wait_exit) != 0
    await admitted(k.crds, PYTORCHJOB, k.namespace, "adopted", 1, k.kubeflow)
    k.operator()
    await run_to_success(k.kubeflow, PYTORCHJOB, k.namespace, "adopted", 1)
    body = await settled(k.crds, k.namespace, "adopted")
    assert body["status"]["state"] == "succeeded"
    assert [s["n"] for s in body["status"]["submissions"]] == [1]
    assert len(await asyncio.to_thread(objects, k.crds, PYTORCHJOB, k.namespace, "adopted")) == 1


async def test_the_operator_killed_while_kueue_evicts(k: Kueued) -> None:
    """SIGKILL while the job runs; Kueue preempts it (suspends it, requeues its Workload) while no
    operator runs; the restarted operator records one preemption and one resubmission, as if it
    had watched."""
    op = k.operator()
    rules = [{"on": ["preempted"], "budget": 2}]
    await asyncio.to_thread(
        apply, k.crds, k.namespace, manifest(PYTORCHJOB, "evicted", k.queues.queue, rules=rules)
    )
    first = await admitted(k.crds, PYTORCHJOB, k.namespace, "evicted", 1, k.kubeflow)
    op.kill()
    await asyncio.to_thread(preemptor, k.crds, k.queues, "urgent")

    def evicted() -> bool:
        wl = workload_for(k.crds, k.namespace, first)
        return bool(wl and is_true(wl, "Evicted"))

    await await_for("Kueue to evict submission 1", evicted)
    k.operator()
    await resubmitted(k.crds, k.queues, "evicted", 2, "urgent")
    await admitted(k.crds, PYTORCHJOB, k.namespace, "evicted", 2, k.kubeflow)
    await run_to_success(k.kubeflow, PYTORCHJOB, k.namespace, "evicted", 2)
    body = await settled(k.crds, k.namespace, "evicted")
    assert history(body) == SEED_HISTORY
    assert [s["n"] for s in body["status"]["submissions"]] == [1, 2]
    assert k.monitor.max_live["evicted"] == 1


# ---- 8. behaviour 5: the other kinds Kueue integrates ------------------------------------------------


@pytest.mark.parametrize("kind", OTHER_KINDS)
async def test_every_kueue_kind_is_admitted_preempted_and_recovered(
    kind: Kind, kind_lab: Lab, k: Kueued
) -> None:
    k.operator("--backend", kind.backend)
    rules = [{"on": ["preempted"], "budget": 1}]
    await asyncio.to_thread(apply, k.crds, k.namespace, manifest(kind, "any", k.queues.queue, rules=rules))
    first, body = await recovered_once(k.crds, kind, k.queues, "any", k.kubeflow)
    # Kueue unsuspended it, not dispatch.
    owners = suspend_owners(kind, first)
    assert owners
    assert DISPATCH_MANAGER not in owners, owners
    assert history(body) == SEED_HISTORY
    assert k.monitor.max_live["any"] == 1

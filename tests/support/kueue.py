"""pytest plugin and helpers: Kueue's objects on the lab (the lab's ``kueue`` extra).

Fixtures
--------
``kueue_lab`` (session)
    The session's lab with Kueue started on it (once, on first use), plus the objects every test
    shares: the ResourceFlavor :data:`FLAVOR` and the WorkloadPriorityClasses :data:`LOW` and
    :data:`HIGH`.
``queues`` (function)
    Two ClusterQueues of the test's own, in a cohort of the test's own, each with a LocalQueue in
    the test's namespace (:class:`Queues`): quota is never shared with another test, so a test's
    leftovers (namespaces are deleted in the background) cannot take it. ``install_queues`` builds
    other quotas.

The ClusterQueues preempt ``withinClusterQueue: LowerPriority`` and ``reclaimWithinCohort: Any``.
The first ClusterQueue has a borrowing limit of 0 by default: a higher-priority workload there
then preempts instead of borrowing the other queue's quota (Kueue prefers borrowing when it can).

Everything is read as ``kueue.x-k8s.io/v1beta2`` (see tests.support.lab: other versions need the
conversion webhook, which the lab cannot serve with a trusted certificate).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import pytest

from tests.support.kube import KubeCluster
from tests.support.lab import Lab, LabError

API: Final = "kueue.x-k8s.io/v1beta2"
WORKLOADS: Final = "workloads.v1beta2.kueue.x-k8s.io"
"""kubectl's resource.version.group: always v1beta2, never a converted version."""
QUEUE_LABEL: Final = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL: Final = "kueue.x-k8s.io/priority-class"
FLAVOR: Final = "lab-flavor"
LOW: Final = "low"
HIGH: Final = "high"
PRIORITIES: Final = ((LOW, 100), (HIGH, 10000))
COVERED: Final = ("cpu", "memory")
"""The resources the ClusterQueues cover: a pod that asks for another (a GPU) is inadmissible."""


@dataclass(frozen=True)
class Queues:
    """One test's queues: ``queue`` feeds ``cluster_queue``, ``other_queue`` feeds the other one."""

    namespace: str
    queue: str
    other_queue: str
    cluster_queue: str
    other_cluster_queue: str
    cohort: str


def shared_objects() -> list[dict[str, Any]]:
    """The ResourceFlavor and the two WorkloadPriorityClasses (cluster-scoped, one set per lab)."""
    docs: list[dict[str, Any]] = [{"apiVersion": API, "kind": "ResourceFlavor", "metadata": {"name": FLAVOR}}]
    docs += [
        {
            "apiVersion": API,
            "kind": "WorkloadPriorityClass",
            "metadata": {"name": name},
            "value": value,
            "description": "the test lab: Kueue preemption by priority",
        }
        for name, value in PRIORITIES
    ]
    return docs


def _cluster_queue(
    name: str, cohort: str, namespace: str, quota: Mapping[str, str], borrowing_limit: str | None
) -> dict[str, Any]:
    resources = []
    for resource in COVERED:
        entry: dict[str, Any] = {"name": resource, "nominalQuota": quota[resource]}
        if borrowing_limit is not None:
            entry["borrowingLimit"] = borrowing_limit
        resources.append(entry)
    return {
        "apiVersion": API,
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {
            "cohortName": cohort,
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "resourceGroups": [
                {"coveredResources": list(COVERED), "flavors": [{"name": FLAVOR, "resources": resources}]}
            ],
            "preemption": {"withinClusterQueue": "LowerPriority", "reclaimWithinCohort": "Any"},
        },
    }


def queue_objects(
    namespace: str,
    *,
    cpu: str = "2",
    memory: str = "8Gi",
    borrowing_limit: str | None = "0",
    other_cpu: str = "2",
    other_memory: str = "8Gi",
) -> tuple[Queues, list[dict[str, Any]]]:
    """The two ClusterQueues (named after the namespace, which is unique) and their LocalQueues."""
    queues = Queues(
        namespace=namespace,
        queue="lq",
        other_queue="lq-other",
        cluster_queue=f"{namespace}-a",
        other_cluster_queue=f"{namespace}-b",
        cohort=namespace,
    )
    docs = [
        _cluster_queue(
            queues.cluster_queue, queues.cohort, namespace, {"cpu": cpu, "memory": memory}, borrowing_limit
        ),
        _cluster_queue(
            queues.other_cluster_queue,
            queues.cohort,
            namespace,
            {"cpu": other_cpu, "memory": other_memory},
            None,
        ),
    ]
    for local, cq in ((queues.queue, queues.cluster_queue), (queues.other_queue, queues.other_cluster_queue)):
        docs.append(
            {
                "apiVersion": API,
                "kind": "LocalQueue",
                "metadata": {"name": local, "namespace": namespace},
                "spec": {"clusterQueue": cq},
            }
        )
    return queues, docs


def batch_job(
    namespace: str,
    name: str,
    queue: str,
    *,
    cpu: str = "2",
    memory: str = "1Gi",
    priority: str | None = HIGH,
    image: str = "example.invalid/preemptor:1",
) -> dict[str, Any]:
    """A plain batch/v1 Job for a LocalQueue, created suspended as Kueue's webhook would make it
    (the lab registers no Kueue webhook): Kueue admits it and unsuspends it. Its pod keeps running
    (kwok completes Job pods only after the delay annotated here)."""
    labels = {QUEUE_LABEL: queue, **({PRIORITY_LABEL: priority} if priority else {})}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "suspend": True,
            "parallelism": 1,
            "completions": 1,
            "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": {"pod-complete.stage.kwok.x-k8s.io/delay": "1h"}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "main",
                            "image": image,
                            "resources": {"requests": {"cpu": cpu, "memory": memory}},
                        }
                    ],
                },
            },
        },
    }


# ---- reading Workloads ---------------------------------------------------------------------------


def workloads(cluster: KubeCluster, namespace: str) -> list[dict[str, Any]]:
    out = cluster.kubectl("get", WORKLOADS, "-n", namespace, "-o", "json")
    items: list[dict[str, Any]] = json.loads(out)["items"]
    return items


def workload_of(items: Sequence[Mapping[str, Any]], owner_uid: str) -> dict[str, Any] | None:
    """The Workload Kueue made for the object with uid ``owner_uid`` (its ownerReference)."""
    for wl in items:
        if any(
            ref.get("uid") == owner_uid for ref in (wl.get("metadata") or {}).get("ownerReferences") or ()
        ):
            return dict(wl)
    return None


def condition(wl: Mapping[str, Any], kind: str) -> dict[str, Any] | None:
    for c in (wl.get("status") or {}).get("conditions") or ():
        if c.get("type") == kind:
            return dict(c)
    return None


def is_true(wl: Mapping[str, Any], kind: str) -> bool:
    c = condition(wl, kind)
    return bool(c and c.get("status") == "True")


def evictions(wl: Mapping[str, Any]) -> int:
    """How many times Kueue evicted it (status.schedulingStats.evictions: survives re-admission)."""
    stats = ((wl.get("status") or {}).get("schedulingStats") or {}).get("evictions") or ()
    return sum(int(e.get("count") or 0) for e in stats)


def deactivate(cluster: KubeCluster, namespace: str, workload: str) -> None:
    """What an administrator does: ``spec.active=false`` (Kueue then evicts it, reason Deactivated)."""
    cluster.kubectl(
        "patch",
        f"{WORKLOADS}/{workload}",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"active": False}}),
    )


# ---- fixtures ------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def kueue_lab(lab: Lab, kube_cluster: KubeCluster) -> Lab:
    """The session's lab with Kueue (once, on first use) and the shared Kueue objects."""
    try:
        lab.start_extras(("kueue",))
    except LabError as e:
        pytest.fail(str(e), pytrace=False)
    print(f"\nkueue up in {lab.extras_seconds.get('kueue')}s", file=sys.stderr)
    kube_cluster.apply(shared_objects())
    return lab


def install_queues(cluster: KubeCluster, namespace: str, **quota: Any) -> Queues:
    queues, docs = queue_objects(namespace, **quota)
    cluster.apply(docs)
    return queues


@pytest.fixture
def queues(
    kueue_lab: Lab, kube_cluster: KubeCluster, namespace: str, request: pytest.FixtureRequest
) -> Iterator[Queues]:
    """The test's two ClusterQueues (default quota: cpu 2, memory 8Gi each) and LocalQueues;
    other quota with ``@pytest.mark.parametrize("queues", [{"cpu": "1"}], indirect=True)``
    (the keywords of :func:`queue_objects`)."""
    made = install_queues(kube_cluster, namespace, **getattr(request, "param", {}))
    try:
        yield made
    finally:
        # Cluster-scoped, so not deleted with the namespace; their finalizer waits for its Workloads.
        names = [
            f"clusterqueues.v1beta2.kueue.x-k8s.io/{cq}"
            for cq in (made.cluster_queue, made.other_cluster_queue)
        ]
        kube_cluster.kubectl("delete", *names, "--wait=false", "--ignore-not-found", check=False)

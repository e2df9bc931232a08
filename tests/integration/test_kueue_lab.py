"""The lab's Kueue by itself (the ``kueue`` extra and tests.support.kueue, no dispatch): what the
Kueue tests of dispatch rely on. A suspended, queue-labelled batch/v1 Job is admitted and
unsuspended by Kueue; a higher-priority one that needs the whole quota of the same ClusterQueue
preempts it (Kueue suspends it again, condition Preempted reason InClusterQueue); and a ClusterQueue
without a cohort's quota of its own borrows, and is reclaimed by the lender.
"""

from __future__ import annotations

import pytest

from tests.support.kube import KubeCluster
from tests.support.kueue import HIGH, LOW, Queues, batch_job, condition, is_true, workload_of, workloads
from tests.support.lab import Lab

pytestmark = [pytest.mark.integration, pytest.mark.kueue]


def job_uid(cluster: KubeCluster, namespace: str, name: str) -> str:
    return str(cluster.get("job", name, namespace)["metadata"]["uid"])


def suspended(cluster: KubeCluster, namespace: str, name: str) -> bool:
    return bool(cluster.get("job", name, namespace)["spec"].get("suspend"))


def running_pods(lab: Lab, namespace: str, name: str) -> int:
    return sum(
        1
        for p in lab.pods(namespace, f"batch.kubernetes.io/job-name={name}")
        if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    )


def workload(cluster: KubeCluster, namespace: str, name: str) -> dict[str, object] | None:
    return workload_of(workloads(cluster, namespace), job_uid(cluster, namespace, name))


def test_kueue_admits_a_queued_job_and_preempts_it_for_a_higher_priority_one(
    kueue_lab: Lab, kube_cluster: KubeCluster, namespace: str, queues: Queues
) -> None:
    kube_cluster.apply(batch_job(namespace, "low", queues.queue, priority=LOW))
    kueue_lab.wait(
        "low admitted", lambda: is_true(workload(kube_cluster, namespace, "low") or {}, "Admitted")
    )
    kueue_lab.wait("low unsuspended, its pod running", lambda: running_pods(kueue_lab, namespace, "low") == 1)
    assert not suspended(kube_cluster, namespace, "low")

    kube_cluster.apply(batch_job(namespace, "high", queues.queue, priority=HIGH))
    kueue_lab.wait("low evicted", lambda: is_true(workload(kube_cluster, namespace, "low") or {}, "Evicted"))
    evicted = workload(kube_cluster, namespace, "low") or {}
    assert (condition(evicted, "Evicted") or {}).get("reason") == "Preempted"
    assert (condition(evicted, "Preempted") or {}).get("reason") == "InClusterQueue"
    kueue_lab.wait("low suspended again", lambda: suspended(kube_cluster, namespace, "low"))
    kueue_lab.wait(
        "high admitted", lambda: is_true(workload(kube_cluster, namespace, "high") or {}, "Admitted")
    )
    kueue_lab.wait("high's pod running", lambda: running_pods(kueue_lab, namespace, "high") == 1)
    # The quota holds one of them: the preempted one waits, requeued by Kueue itself.
    requeued = workload(kube_cluster, namespace, "low") or {}
    assert not is_true(requeued, "QuotaReserved")


@pytest.mark.parametrize("queues", [{"cpu": "0", "memory": "0", "borrowing_limit": None}], indirect=True)
def test_a_lender_reclaims_the_quota_its_cohort_borrowed(
    kueue_lab: Lab, kube_cluster: KubeCluster, namespace: str, queues: Queues
) -> None:
    kube_cluster.apply(batch_job(namespace, "borrower", queues.queue, priority=HIGH))
    kueue_lab.wait(
        "borrower admitted", lambda: is_true(workload(kube_cluster, namespace, "borrower") or {}, "Admitted")
    )
    kube_cluster.apply(batch_job(namespace, "lender", queues.other_queue, priority=LOW))
    kueue_lab.wait(
        "borrower evicted", lambda: is_true(workload(kube_cluster, namespace, "borrower") or {}, "Evicted")
    )
    evicted = workload(kube_cluster, namespace, "borrower") or {}
    assert (condition(evicted, "Preempted") or {}).get("reason") == "InCohortReclamation"
    kueue_lab.wait(
        "lender admitted", lambda: is_true(workload(kube_cluster, namespace, "lender") or {}, "Admitted")
    )

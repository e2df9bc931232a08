#!/usr/bin/env python3
"""Record what the real Kueue says about the objects dispatch releases into its queues, for the
unit tests of dispatch's Kueue reading (tests/unit/test_kueue*.py).

Starts its own lab with the ``kueue`` extra (``tests.support.lab.Lab(extras=("kueue",))``: Kueue
v0.17.0 in front of the real training operator, kube-scheduler and kwok), then, for each scenario,
installs a ResourceFlavor, two ClusterQueues in a cohort and their LocalQueues
(``tests.support.kueue``), creates a PyTorchJob built by dispatch's own builder (held: suspended,
no queue label), releases it as dispatch does for a queued job (ONE patch adding the queue and
priority-class labels and the released annotation, leaving suspend=true), makes Kueue act through
its real mechanism (quota, a higher-priority batch/v1 Job, reclamation by the cohort, its
PodsReady timeout, an administrator's spec.active=false) and records, in arrival order, every watch
event of the namespace's PyTorchJobs, Workloads, Jobs and pods, then the Events written there.
Nothing is written by hand: re-record with

    .venv/bin/python hack/kueue-record.py [--only NAME ...]      (or: make kueue-record)

Output: tests/unit/data/kueue/<scenario>.json. ``metadata.managedFields`` is dropped (size); the
builder's finalizer and ownerReferences are dropped before creation (no operator or DispatchJob
here). Each recording has its own namespace, ``rec-kueue-<scenario>``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "operator"))
sys.path.insert(0, str(ROOT))

from dispatch import KubeflowOptions  # noqa: E402
from dispatch._backends.kubeflow._kind import build  # noqa: E402
from dispatch._constants import ANNOTATION_RELEASED  # noqa: E402
from dispatch._model import (  # noqa: E402
    Action,
    CauseKind,
    Enforcer,
    JobSpec,
    Plan,
    PlannedRule,
    Resources,
)
from dispatch._workload import Target  # noqa: E402
from tests.support.kueue import (  # noqa: E402
    HIGH,
    LOW,
    PRIORITY_LABEL,
    QUEUE_LABEL,
    WORKLOADS,
    Queues,
    batch_job,
    queue_objects,
    shared_objects,
)
from tests.support.lab import KUEUE_PODS_READY_TIMEOUT, UNPULLABLE_IMAGE, Lab  # noqa: E402

sys.path.insert(0, str(ROOT / "hack"))
from _recording import Recording, write  # noqa: E402

Body = dict[str, Any]
OUT = ROOT / "tests" / "unit" / "data" / "kueue"
IMAGE = "example.invalid/train:1"
EVERYTHING = "!lab.dispatch.io/none"
"""A selector every object matches (Kueue's Workloads and the preemptor Job carry no dispatch label)."""
_NAMESPACE = ["rec"]


def namespace() -> str:
    return _NAMESPACE[0]


def plan(name: str) -> Plan:
    rule = PlannedRule(
        index=0, on=(CauseKind.PREEMPTED,), action=Action.RESUBMIT, budget=3, enforcer=Enforcer.SUPERVISOR
    )
    return Plan(job=f"{namespace()}/{name}", rules=(rule,))


class Scenario:
    """One PyTorchJob (2 pods of cpu 1, memory 1Gi), built by dispatch, created held."""

    def __init__(self, lab: Lab, queues: Queues, job: str, *, image: str = IMAGE) -> None:
        self.lab, self.queues = lab, queues
        spec = JobSpec(
            name=job,
            command=("python", "train.py"),
            nodes=2,
            kubeflow=KubeflowOptions(
                image=image, resources=Resources(cpu="1", memory="1Gi"), no_capacity_after_seconds=5
            ),
        )
        body = build(Target(namespace(), job, 1), spec, plan(job))
        body["metadata"].pop("finalizers", None)
        body["metadata"].pop("ownerReferences", None)
        self.name = body["metadata"]["name"]
        self.path = f"/apis/kubeflow.org/v1/namespaces/{namespace()}/pytorchjobs/{self.name}"
        self.uid = self.lab.request("POST", self.path.rsplit("/", 1)[0], body)["metadata"]["uid"]

    def release(self, queue: str | None = None, priority: str = LOW) -> None:
        """dispatch's release of a queued job: labels and the released annotation; suspend stays."""
        patch = {
            "metadata": {
                "labels": {QUEUE_LABEL: queue or self.queues.queue, PRIORITY_LABEL: priority},
                "annotations": {ANNOTATION_RELEASED: "1"},
            }
        }
        self.lab.request("PATCH", self.path, patch, content_type="application/merge-patch+json")

    def workload(self) -> Body | None:
        items = self.lab.request("GET", f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{namespace()}/workloads")
        for wl in items.get("items") or ():
            if any(r.get("uid") == self.uid for r in wl["metadata"].get("ownerReferences") or ()):
                return dict(wl)
        return None

    def workload_has(self, kind: str, status: str = "True", reason: str | None = None) -> bool:
        wl = self.workload() or {}
        return any(
            c.get("type") == kind and c.get("status") == status and reason in (None, c.get("reason"))
            for c in (wl.get("status") or {}).get("conditions") or ()
        )

    def running(self) -> list[Body]:
        def ready() -> list[Body]:
            pods = [
                p
                for p in self.lab.pods(namespace(), f"training.kubeflow.org/job-name={self.name}")
                if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
            ]
            return pods if len(pods) >= 2 else []

        out: list[Body] = self.lab.wait("pods Running", ready, 90)
        return out

    def suspended(self) -> bool:
        pj = self.lab.request("GET", self.path)
        return bool(pj["spec"].get("runPolicy", {}).get("suspend"))


def until(lab: Lab, what: str, check: Callable[[], bool], seconds: float = 90) -> None:
    lab.wait(what, check, seconds, interval=0.2)


def create_batch_job(lab: Lab, name: str, queue: str, **kw: Any) -> None:
    lab.request(
        "POST", f"/apis/batch/v1/namespaces/{namespace()}/jobs", batch_job(namespace(), name, queue, **kw)
    )


# ---- scenarios: each takes (lab, queues) --------------------------------------------------------


def sc_admitted(lab: Lab, queues: Queues) -> None:
    """Admitted, unsuspended by Kueue, run by the training operator; every pod exits 0: Finished."""
    s = Scenario(lab, queues, "admitted")
    s.release()
    until(lab, "admitted", lambda: s.workload_has("Admitted"))
    pods = sorted(s.running(), key=lambda p: "master" in p["metadata"]["name"])
    for pod in pods:
        lab.exit_pod(namespace(), pod["metadata"]["name"], 0)
    until(lab, "finished", lambda: s.workload_has("Finished"))
    time.sleep(2)


def sc_pending_quota(lab: Lab, queues: Queues) -> None:
    """The ClusterQueue holds cpu 1; the job asks for 2: the Workload waits (QuotaReserved=False)."""
    s = Scenario(lab, queues, "pending")
    s.release()
    until(lab, "pending", lambda: s.workload_has("QuotaReserved", "False", "Pending"))
    time.sleep(5)


def sc_preempted(lab: Lab, queues: Queues) -> None:
    """Admitted and running at priority low; a batch/v1 Job at priority high in the same LocalQueue
    needs the whole quota: Kueue evicts the PyTorchJob (Preempted, InClusterQueue), suspends it,
    and requeues its Workload, which then waits for quota."""
    s = Scenario(lab, queues, "preempted")
    s.release()
    s.running()
    create_batch_job(lab, "preemptor", queues.queue, priority=HIGH)
    until(lab, "evicted", lambda: s.workload_has("Evicted", reason="Preempted"))
    until(lab, "suspended again", s.suspended)
    until(lab, "requeued", lambda: s.workload_has("QuotaReserved", "False"))
    time.sleep(3)


def sc_reclaimed(lab: Lab, queues: Queues) -> None:
    """Its ClusterQueue has no quota of its own: it borrows the cohort's; a Job in the other
    ClusterQueue (the lender) reclaims it (Preempted, InCohortReclamation)."""
    s = Scenario(lab, queues, "reclaimed")
    s.release()
    s.running()
    create_batch_job(lab, "reclaimer", queues.other_queue, priority=LOW)
    until(lab, "evicted", lambda: s.workload_has("Evicted", reason="Preempted"))
    until(lab, "suspended again", s.suspended)
    time.sleep(3)


def sc_pods_ready_timeout(lab: Lab, queues: Queues) -> None:
    """Admitted, but its image never pulls (kwok's lab-image-pull-error stage): after the
    waitForPodsReady timeout Kueue evicts it (PodsReadyTimeout) and requeues it after a backoff."""
    s = Scenario(lab, queues, "pods-ready-timeout", image=UNPULLABLE_IMAGE)
    s.release()
    until(lab, "admitted", lambda: s.workload_has("Admitted"))
    until(lab, "evicted", lambda: s.workload_has("Evicted", reason="PodsReadyTimeout"), 180)
    until(lab, "suspended again", s.suspended)
    time.sleep(3)


def sc_deactivated(lab: Lab, queues: Queues) -> None:
    """Admitted and running; an administrator sets the Workload's spec.active=false: Kueue evicts
    it (Deactivated) and suspends the PyTorchJob; it is never requeued."""
    s = Scenario(lab, queues, "deactivated")
    s.release()
    s.running()
    wl = s.workload()
    assert wl is not None
    lab.kubectl(
        "patch",
        f"{WORKLOADS}/{wl['metadata']['name']}",
        "-n",
        namespace(),
        "--type=merge",
        "-p",
        json.dumps({"spec": {"active": False}}),
    )
    until(lab, "evicted", lambda: s.workload_has("Evicted", reason="Deactivated"))
    until(lab, "suspended again", s.suspended)
    time.sleep(3)


# name: (what, quota, run)
SCENARIOS: dict[str, tuple[str, dict[str, Any], Callable[[Lab, Queues], None]]] = {
    "admitted": ("admitted into a ClusterQueue of cpu 2, run, every container exits 0", {}, sc_admitted),
    "pending-quota": (
        "a ClusterQueue of cpu 1 (no borrowing) for a job of cpu 2",
        {"cpu": "1"},
        sc_pending_quota,
    ),
    "preempted": (
        "running at WorkloadPriorityClass low; a batch/v1 Job at high in the same LocalQueue preempts it",
        {},
        sc_preempted,
    ),
    "reclaimed": (
        "borrowing the cohort's quota (own nominal cpu 0); a Job in the lending ClusterQueue reclaims it",
        {"cpu": "0", "memory": "0", "borrowing_limit": None},
        sc_reclaimed,
    ),
    "pods-ready-timeout": (
        f"admitted, its image never pulls: evicted after waitForPodsReady.timeout {KUEUE_PODS_READY_TIMEOUT}",
        {},
        sc_pods_ready_timeout,
    ),
    "deactivated": (
        "running; the Workload's spec.active set to false by an administrator",
        {},
        sc_deactivated,
    ),
}


def record(lab: Lab, name: str) -> None:
    what, quota, run = SCENARIOS[name]
    _NAMESPACE[0] = f"rec-kueue-{name}"
    lab.kubectl("delete", "namespace", namespace(), "--wait=true", "--timeout=60s", check=False)
    lab.kubectl("create", "namespace", namespace())
    queues, docs = queue_objects(namespace(), **quota)
    lab.kubectl("apply", "--server-side", "-f", "-", input="\n---\n".join(json.dumps(d) for d in docs))
    rec = Recording(name, what, namespace())
    rec.watch("pytorchjobs.kubeflow.org", EVERYTHING)
    rec.watch(WORKLOADS, EVERYTHING)
    rec.watch("jobs.batch", EVERYTHING)
    rec.watch("pods", EVERYTHING)
    time.sleep(1.0)
    try:
        run(lab, queues)
    finally:
        rec.stop()
        rec.extra_objects.extend(
            lab.request("GET", f"/apis/kueue.x-k8s.io/v1beta2/clusterqueues/{cq}")
            for cq in (queues.cluster_queue, queues.other_cluster_queue)
        )
        for obj in rec.extra_objects:
            obj["metadata"].pop("managedFields", None)
        lab.kubectl("delete", "namespace", namespace(), "--wait=false", check=False)
        lab.kubectl(
            "delete",
            "clusterqueues.v1beta2.kueue.x-k8s.io",
            queues.cluster_queue,
            queues.other_cluster_queue,
            "--wait=false",
            check=False,
        )
    write(OUT, name, rec, {"backend": "kubeflow", "kueue": "v0.17.0", "training_operator": "v1.9.3"})


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", nargs="*", choices=sorted(SCENARIOS))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kueue-record-") as tmp, Lab(Path(tmp), extras=("kueue",)) as lab:
        print(f"lab up in {lab.start_seconds:.1f}s (extras {lab.extras_seconds})", flush=True)
        os.environ["KUBECONFIG"] = str(lab.kubeconfig)  # for _recording's kubectl
        lab.kubectl(
            "apply", "--server-side", "-f", "-", input="\n---\n".join(json.dumps(d) for d in shared_objects())
        )
        for name in args.only or list(SCENARIOS):
            record(lab, name)


if __name__ == "__main__":
    main()

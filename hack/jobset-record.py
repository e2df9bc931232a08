#!/usr/bin/env python3
"""Record what the real stack says about JobSets and TrainJobs, for tests/unit/test_jobset*.py and
tests/unit/test_trainjob*.py.

Starts its own lab with the extras (``tests.support.lab.Lab(extras=("trainer",))``: kube-scheduler,
kube-controller-manager's Job controller, kwok, JobSet v0.11.1 with its webhooks, Kubeflow Trainer
v2.2.0), then, for each scenario, creates a JobSet or TrainJob built by dispatch's own builder,
releases it, makes Kubernetes fail it through its real mechanism (kwok's container-exit stage, a
real kube-scheduler preemption, the Eviction API) and records, in arrival order, every watch event
of the JobSet/TrainJob, of the JobSets, Jobs and pods in the namespace, then the Events Kubernetes
wrote there. Nothing is written by hand: re-record with

    .venv/bin/python hack/jobset-record.py [--only NAME ...]      (or: make jobset-record)

Output: tests/unit/data/jobset/<scenario>.json and tests/unit/data/trainjob/<scenario>.json.
``metadata.managedFields`` is dropped (size); the builder's finalizer is dropped before creation
(no operator runs here to remove it), and it puts no ownerReference (the recorder passes no owner).
Each recording has its own namespace, ``rec-<backend>-<scenario>``.
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

from dispatch._backends.jobset import JobSetOptions  # noqa: E402
from dispatch._backends.jobset._kind import build as build_jobset  # noqa: E402
from dispatch._backends.trainjob import TrainJobOptions  # noqa: E402
from dispatch._backends.trainjob._kind import build as build_trainjob  # noqa: E402
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
from tests.support.lab import Lab  # noqa: E402

sys.path.insert(0, str(ROOT / "hack"))
from _recording import Recording, write  # noqa: E402

Body = dict[str, Any]
DATA = ROOT / "tests" / "unit" / "data"
_NAMESPACE = ["rec"]


def namespace() -> str:
    return _NAMESPACE[0]


IMAGE = "example.invalid/train:1"
DISPATCH_PODS = "app.kubernetes.io/managed-by=dispatch"


def plan(name: str, restart_left: int | None) -> Plan:
    if restart_left is None:
        rule = PlannedRule(
            index=0, on=(CauseKind.PREEMPTED,), action=Action.RESUBMIT, budget=3, enforcer=Enforcer.SUPERVISOR
        )
    else:
        rule = PlannedRule(
            index=0,
            on=(CauseKind.NON_ZERO_EXIT, CauseKind.OUT_OF_MEMORY),
            action=Action.RESTART,
            budget=restart_left,
            enforcer=Enforcer.SCHEDULER,
        )
    return Plan(job=f"{namespace()}/{name}", rules=(rule,))


def spec(name: str, backend: str, *, nodes: int = 2) -> JobSpec:
    res = Resources(cpu="1", memory="1Gi")
    options: Any
    if backend == "jobset":
        options = JobSetOptions(image=IMAGE, resources=res, env={"A": "1"}, no_capacity_after_seconds=5)
    else:
        options = TrainJobOptions(
            runtime="torch-distributed",
            image=IMAGE,
            resources=res,
            env={"A": "1"},
            no_capacity_after_seconds=5,
        )
    return JobSpec(name=name, command=("python", "train.py"), nodes=nodes, options={backend: options})


class Scenario:
    """One object of BACKEND, built by dispatch, created and released in the recording namespace."""

    def __init__(self, lab: Lab, backend: str, job: str, *, nodes: int = 2, restart_left: int | None = None):
        self.lab, self.backend, self.nodes = lab, backend, nodes
        target = Target(namespace=namespace(), job_name=job, submission=1)
        build = build_jobset if backend == "jobset" else build_trainjob
        self.body = build(target, spec(job, backend, nodes=nodes), plan(job, restart_left))
        self.name = target.name
        self.plural = "jobsets" if backend == "jobset" else "trainjobs"
        self.container = "main" if backend == "jobset" else "node"
        self.first_uids: set[str] = set()
        self.body["metadata"].pop("finalizers", None)
        self.lab.kubectl("create", "-f", "-", input=json.dumps(self.body))

    @property
    def path(self) -> str:
        group = "jobset.x-k8s.io/v1alpha2" if self.backend == "jobset" else "trainer.kubeflow.org/v1alpha1"
        return f"/apis/{group}/namespaces/{namespace()}/{self.plural}/{self.name}"

    def release(self) -> None:
        self.lab.request(
            "PATCH", self.path, {"spec": {"suspend": False}}, content_type="application/merge-patch+json"
        )

    def get(self) -> Body:
        return self.lab.request("GET", self.path)

    def condition(self, kind: str) -> bool:
        return any(
            c.get("type") == kind and c.get("status") == "True"
            for c in (self.get().get("status") or {}).get("conditions") or ()
        )

    def failed(self) -> bool:
        """Failed; for a TrainJob also: a container restarted in place (the runtimes' pods are
        restartPolicy OnFailure) or a failed pod replaced by its Job (backoffLimit 6 by default):
        what the recording is for, dispatch stops the TrainJob there."""
        if self.condition("Failed"):
            return True
        if self.backend != "trainjob":
            return False
        pods = self.lab.pods(namespace(), DISPATCH_PODS)
        restarted = any(
            int(c.get("restartCount") or 0) > 0
            for p in pods
            for c in p["status"].get("containerStatuses") or ()
        )
        replaced = bool(self.first_uids) and any(p["metadata"]["uid"] not in self.first_uids for p in pods)
        return restarted or replaced

    def pods(self, phase: str = "Running") -> list[Body]:
        pods = self.lab.pods(namespace(), DISPATCH_PODS)
        return sorted(
            (
                p
                for p in pods
                if p["status"].get("phase") == phase and not p["metadata"].get("deletionTimestamp")
            ),
            key=lambda p: p["metadata"]["name"],
        )

    def running(self, count: int | None = None, *, restart: int | None = None) -> list[Body]:
        def ready() -> list[Body]:
            pods = self.pods()
            if restart is not None:
                pods = [
                    p
                    for p in pods
                    if p["metadata"]["labels"].get("jobset.sigs.k8s.io/restart-attempt") == str(restart)
                ]
            return pods if len(pods) >= (count or self.nodes) else []

        out: list[Body] = self.lab.wait("pods Running", ready, 60)
        self.first_uids = self.first_uids or {p["metadata"]["uid"] for p in out}
        return out

    def exit(self, pod: Body, code: int, reason: str | None = None) -> None:
        self.lab.exit_pod(namespace(), pod["metadata"]["name"], code, reason=reason, container=self.container)


def until(lab: Lab, what: str, check: Callable[[], bool], seconds: float = 60) -> None:
    lab.wait(what, check, seconds, interval=0.2)


# ---- scenarios: each takes (lab, backend) ------------------------------------------------------


def sc_success(lab: Lab, backend: str) -> None:
    s = Scenario(lab, backend, "success")
    s.release()
    for pod in reversed(s.running()):
        s.exit(pod, 0)
    until(lab, "complete", lambda: s.condition("Completed" if backend == "jobset" else "Complete"))


def failure(job: str, fail: Callable[[Scenario], object]) -> Callable[[Lab, str], None]:
    """Released, its pods running, then ``fail``: until the object fails (or, for a TrainJob, its
    pod is restarted or replaced), and two more seconds of what follows."""

    def run(lab: Lab, backend: str) -> None:
        s = Scenario(lab, backend, job)
        s.release()
        fail(s)
        until(lab, "failed", s.failed)
        time.sleep(2)

    return run


sc_exit = failure("exit", lambda s: s.exit(s.running()[0], 1))
sc_oom = failure("oom", lambda s: s.exit(s.running()[0], 137, "OOMKilled"))
sc_preempt = failure("preempt", lambda s: s.lab.preempt_pod(namespace(), s.running()[1]["metadata"]["name"]))
sc_evict = failure("evict", lambda s: s.lab.evict_pod(namespace(), s.running()[0]["metadata"]["name"]))


def sc_restarts_exhausted(lab: Lab, backend: str) -> None:
    """The native rule with 1 restart left: an exit 1 restarts the JobSet (every pod recreated,
    restart-attempt 1), a second exit 1 fails it with ReachedMaxRestarts."""
    s = Scenario(lab, backend, "restarts-exhausted", restart_left=1)
    s.release()
    s.exit(s.running(restart=0)[0], 1)
    s.exit(s.running(restart=1)[1], 1)
    until(lab, "failed", s.failed)
    time.sleep(2)


def sc_restart_then_success(lab: Lab, backend: str) -> None:
    """The native rule with 2 restarts left: an OOM restarts the JobSet, then every pod exits 0."""
    s = Scenario(lab, backend, "restart-success", restart_left=2)
    s.release()
    s.exit(s.running(restart=0)[0], 137, "OOMKilled")
    for pod in reversed(s.running(restart=1)):
        s.exit(pod, 0)
    until(lab, "complete", lambda: s.condition("Completed"))


SCENARIOS: dict[str, tuple[str, tuple[str, ...], Callable[[Lab, str], None]]] = {
    "success": (
        "2 nodes; every container exits 0 (kwok lab-container-exit)",
        ("jobset", "trainjob"),
        sc_success,
    ),
    "exit": ("2 nodes; pod index 0 exits 1", ("jobset", "trainjob"), sc_exit),
    "oom": ("2 nodes; pod index 0 OOMKilled (exit 137)", ("jobset", "trainjob"), sc_oom),
    "preempt": (
        "2 nodes; pod index 1 preempted by kube-scheduler (a lab-high pod needing its cpu)",
        ("jobset", "trainjob"),
        sc_preempt,
    ),
    "evict": ("2 nodes; pod index 0 evicted through the Eviction API", ("jobset", "trainjob"), sc_evict),
    "restarts-exhausted": (
        "native rule, 1 restart left (maxRestarts 1): exit 1, JobSet restarted, exit 1: ReachedMaxRestarts",
        ("jobset",),
        sc_restarts_exhausted,
    ),
    "restart-success": (
        "native rule, 2 restarts left: OOM, JobSet restarted, then every container exits 0",
        ("jobset",),
        sc_restart_then_success,
    ),
}


EVERYTHING = "!lab.dispatch.io/preemptor"
"""A selector for every object of a resource (the Trainer's JobSet and Jobs carry no dispatch label)."""


def record(lab: Lab, name: str, backend: str) -> None:
    what, _, run = SCENARIOS[name]
    _NAMESPACE[0] = f"rec-{backend}-{name}"
    lab.kubectl("delete", "namespace", namespace(), "--wait=true", "--timeout=60s", check=False)
    lab.kubectl("create", "namespace", namespace())
    rec = Recording(name, what, namespace())
    rec.watch("trainjobs.trainer.kubeflow.org", EVERYTHING)
    rec.watch("jobsets.jobset.x-k8s.io", EVERYTHING)
    rec.watch("jobs.batch", EVERYTHING)
    rec.watch("pods", DISPATCH_PODS)
    time.sleep(1.0)
    try:
        run(lab, backend)
    finally:
        rec.stop()
        lab.kubectl("delete", "pods", "-n", namespace(), "-l", "lab.dispatch.io/preemptor=true", check=False)
    versions = {"jobset": "v0.11.1", "trainer": "v2.2.0" if backend == "trainjob" else None}
    write(DATA / backend, name, rec, {"backend": backend, **versions})


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", nargs="*", choices=sorted(SCENARIOS))
    parser.add_argument("--backend", choices=("jobset", "trainjob"), help="only this backend's scenarios")
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="jobset-record-") as tmp,
        Lab(Path(tmp), extras=("trainer",)) as lab,
    ):
        print(f"lab up in {lab.start_seconds:.1f}s (extras {lab.extras_seconds})", flush=True)
        os.environ["KUBECONFIG"] = str(lab.kubeconfig)  # for _recording's kubectl
        for name in args.only or list(SCENARIOS):
            for backend in SCENARIOS[name][1]:
                if args.backend in (None, backend):
                    record(lab, name, backend)


if __name__ == "__main__":
    main()

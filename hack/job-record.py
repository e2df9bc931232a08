#!/usr/bin/env python3
"""Record what the real stack says about batch/v1 Jobs, for tests/unit/test_job_*.py.

Against a running lab (``python -m tests.support.lab up``: the real kube-apiserver, kube-scheduler,
kube-controller-manager with its Job controller, kwok with the lab's stages), each scenario creates
a Job built by dispatch's own builder (``dispatch._backends.job._kind.build``), releases it (unsuspends),
makes Kubernetes fail it through its real mechanism (kwok's container-exit stage, a real
kube-scheduler preemption, an unsatisfiable request, ...) and records, in arrival order, every watch
event of the Job and of its pods, then the events Kubernetes wrote in the namespace. Nothing is
written by hand: re-record with

    KUBECONFIG=<lab>/kubeconfig .venv/bin/python hack/job-record.py [--only NAME ...]

Output: tests/unit/data/job/<scenario>.json (``metadata.managedFields`` dropped). The Jobs have no
ownerReference (the recorder has no DispatchJob, and the garbage collector would delete a Job whose
owner does not exist); dispatch's finalizer is removed by the recorder once a scenario is over.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "operator"))

from _recording import Recording, cleanup_preemptors, get, kubectl, let_go, until, write  # noqa: E402
from _recording import preempt as preempt_in  # noqa: E402

from dispatch._backends.job import JobOptions  # noqa: E402
from dispatch._backends.job._kind import CONTAINER, build  # noqa: E402
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

Body = dict[str, Any]
OUT = ROOT / "tests" / "unit" / "data" / "job"
NAMESPACE = "job-record"
IMAGE = "example.invalid/train:1"
UNPULLABLE = "unpullable.invalid/train:1"


def spec(name: str, *, nodes: int = 1, image: str = IMAGE, gpu: int = 0) -> JobSpec:
    options = JobOptions(
        image=image, resources=Resources(cpu="1", memory="1Gi", gpu=gpu), no_capacity_after_seconds=5
    )
    return JobSpec(name=name, command=("python", "train.py"), nodes=nodes, options={"job": options})


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
    return Plan(job=f"{NAMESPACE}/{name}", rules=(rule,))


def create(job: str, *, restart_left: int | None = None, **kw: Any) -> str:
    body = build(Target(NAMESPACE, job, 1), spec(job, **kw), plan(job, restart_left))
    kubectl("create", "-f", "-", input=json.dumps(body))
    name: str = body["metadata"]["name"]
    return name


def release(job: str) -> None:
    kubectl("patch", "job", job, "-n", NAMESPACE, "--type=merge", "-p", '{"spec":{"suspend":false}}')


def pods(job: str) -> list[Body]:
    return list(get("pods", ns=NAMESPACE, selector=f"batch.kubernetes.io/job-name={job}").get("items") or [])


def wait_running(job: str, count: int = 1, *, besides: tuple[str, ...] = ()) -> list[str]:
    found: list[str] = []

    def check() -> bool:
        found[:] = sorted(
            p["metadata"]["name"]
            for p in pods(job)
            if p["status"].get("phase") == "Running" and p["metadata"]["name"] not in besides
        )
        return len(found) >= count

    until(f"{count} running pod(s) of {job}", check, 90)
    return found


def condition(job: str, kind: str) -> bool:
    body = get("job", job, ns=NAMESPACE)
    return any(
        c["type"] == kind and c["status"] == "True" for c in body.get("status", {}).get("conditions") or []
    )


def exit_pod(pod: str, code: int, reason: str = "") -> None:
    values = {"exit-code": str(code), "exit-container": CONTAINER}
    if reason:
        values["exit-reason"] = reason
    annotations = [f"lab.dispatch.io/{k}={v}" for k, v in values.items()]
    kubectl("annotate", "pod", pod, "-n", NAMESPACE, "--overwrite", *annotations)


def preempt(pod: str) -> None:
    preempt_in(NAMESPACE, pod, IMAGE)


# ---- scenarios -------------------------------------------------------------------------------


def sc_success(rec: Recording) -> None:
    job = create("success")
    release(job)
    exit_pod(wait_running(job)[0], 0)
    until("complete", lambda: condition(job, "Complete"))


def sc_success_indexed(rec: Recording) -> None:
    job = create("success-indexed", nodes=2)
    release(job)
    for pod in wait_running(job, 2):
        exit_pod(pod, 0)
    until("complete", lambda: condition(job, "Complete"))


def sc_exit_never(rec: Recording) -> None:
    job = create("exit-never")
    release(job)
    exit_pod(wait_running(job)[0], 3)
    until("failed", lambda: condition(job, "Failed"))


def sc_oom_never(rec: Recording) -> None:
    job = create("oom-never")
    release(job)
    exit_pod(wait_running(job)[0], 137, "OOMKilled")
    until("failed", lambda: condition(job, "Failed"))


def sc_preempt_never(rec: Recording) -> None:
    job = create("preempt-never")
    release(job)
    preempt(wait_running(job)[0])
    until("failed", lambda: condition(job, "Failed"))
    time.sleep(2)


def sc_restart_native(rec: Recording) -> None:
    """Restart budget 1 (backoffLimit 1): the first pod exits 1, the Job controller replaces it (after
    its 10 s backoff), the replacement exits 0."""
    job = create("restart-native", restart_left=1)
    release(job)
    first = wait_running(job)[0]
    exit_pod(first, 1)
    exit_pod(wait_running(job, besides=(first,))[0], 0)
    until("complete", lambda: condition(job, "Complete"))


def sc_restart_exhausted(rec: Recording) -> None:
    """Restart budget 1: exit 1 (replaced), then the replacement is OOMKilled: BackoffLimitExceeded."""
    job = create("restart-exhausted", restart_left=1)
    release(job)
    first = wait_running(job)[0]
    exit_pod(first, 1)
    exit_pod(wait_running(job, besides=(first,))[0], 137, "OOMKilled")
    until("failed", lambda: condition(job, "Failed"))


def sc_preempt_native(rec: Recording) -> None:
    """Restart budget 2: a preemption is not the rule's: podFailurePolicy FailJob on DisruptionTarget."""
    job = create("preempt-native", restart_left=2)
    release(job)
    preempt(wait_running(job)[0])
    until("failed", lambda: condition(job, "Failed"))
    time.sleep(2)


def sc_unschedulable(rec: Recording) -> None:
    job = create("unschedulable", gpu=64)
    release(job)
    until(
        "unschedulable",
        lambda: any(
            c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
            for p in pods(job)
            for c in p["status"].get("conditions") or []
        ),
    )
    time.sleep(1)


def sc_image_pull(rec: Recording) -> None:
    job = create("image-pull", image=UNPULLABLE)
    release(job)
    time.sleep(6)


def sc_deleted(rec: Recording) -> None:
    """A person deletes the running Job; dispatch's finalizer keeps it readable (with its
    deletionTimestamp) until dispatch lets go, which the recorder does after a moment."""
    job = create("deleted")
    release(job)
    wait_running(job)
    kubectl("delete", "job", job, "-n", NAMESPACE, "--wait=false")
    until("deleting", lambda: bool(get("job", job, ns=NAMESPACE)["metadata"].get("deletionTimestamp")))
    time.sleep(2.0)
    let_go(NAMESPACE, "jobs")
    until("gone", lambda: not get("jobs", ns=NAMESPACE).get("items"))


SCENARIOS: dict[str, tuple[str, Callable[[Recording], None]]] = {
    "success": ("1 node; the container exits 0 (kwok lab-container-exit)", sc_success),
    "success-indexed": ("2 nodes (Indexed); both containers exit 0", sc_success_indexed),
    "exit-never": ("no native rule (backoffLimit 0); the container exits 3", sc_exit_never),
    "oom-never": ("no native rule; the container OOMKilled (exit 137)", sc_oom_never),
    "preempt-never": ("no native rule; the pod preempted by kube-scheduler", sc_preempt_never),
    "restart-native": (
        "restart budget 1: exit 1, replaced by the Job controller, then exit 0",
        sc_restart_native,
    ),
    "restart-exhausted": (
        "restart budget 1: exit 1, replaced, then OOMKilled: BackoffLimitExceeded",
        sc_restart_exhausted,
    ),
    "preempt-native": ("restart budget 2; the pod preempted: podFailurePolicy FailJob", sc_preempt_native),
    "unschedulable": ("1 node asking for 64 GPUs: kube-scheduler cannot place it", sc_unschedulable),
    "image-pull": ("an image that never pulls (kwok stage on unpullable.invalid/)", sc_image_pull),
    "deleted": ("the running Job deleted by a person (dispatch's finalizer holds it)", sc_deleted),
}


def record(name: str) -> None:
    what, run = SCENARIOS[name]
    let_go(NAMESPACE, "jobs")
    kubectl("delete", "namespace", NAMESPACE, "--wait=true", "--timeout=60s", check=False)
    kubectl("create", "namespace", NAMESPACE)
    rec = Recording(name, what, NAMESPACE)
    rec.watch("jobs", "app.kubernetes.io/managed-by=dispatch")
    rec.watch("pods", "app.kubernetes.io/managed-by=dispatch")
    time.sleep(1.0)
    try:
        run(rec)
    finally:
        rec.stop()
        cleanup_preemptors(NAMESPACE)
    write(OUT, name, rec, {})


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", nargs="*", choices=sorted(SCENARIOS))
    args = parser.parse_args()
    if "KUBECONFIG" not in os.environ:
        raise SystemExit("set KUBECONFIG to the lab's kubeconfig")
    try:
        for name in args.only or list(SCENARIOS):
            record(name)
    finally:
        let_go(NAMESPACE, "jobs")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Record what the real stack says about PyTorchJobs, for tests/unit/test_kubeflow_*.py.

Against a running lab (the project's ``python -m tests.support.lab up``, or any cluster with the
real training operator, kube-scheduler, kube-controller-manager and kwok with the lab's stages), each
scenario creates a PyTorchJob built by dispatch's own builder, releases it, makes Kubernetes fail it
through its real mechanism (kwok's container-exit stage, a real kube-scheduler preemption, a
NoExecute taint, ...) and records, in arrival order, every watch event of the PyTorchJob and of its
pods, then the events Kubernetes wrote in the namespace. Nothing is written by hand: re-record with

    KUBECONFIG=<lab>/kubeconfig .venv/bin/python hack/kubeflow-record.py [--only NAME ...]

Output: tests/unit/data/kubeflow/<scenario>.json. ``metadata.managedFields`` is dropped (size); the
PyTorchJob's ownerReferences are dropped before creation (the recorder has no DispatchJob, and the
garbage collector would delete a PyTorchJob whose owner does not exist).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "operator"))

from _recording import (  # noqa: E402
    KUBECTL,
    Recording,
    cleanup_preemptors,
    kubectl,
    let_go,
    trim,
    until,
    write,
)
from _recording import get as get_in  # noqa: E402
from _recording import preempt as preempt_in  # noqa: E402

from dispatch import KubeflowOptions  # noqa: E402
from dispatch._backends.kubeflow._kind import build  # noqa: E402
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
OUT = ROOT / "tests" / "unit" / "data" / "kubeflow"
NAMESPACE = "kubeflow-record"
IMAGE = "example.invalid/train:1"
UNPULLABLE = "unpullable.invalid/train:1"


def get(kind: str, name: str = "", *, ns: str | None = NAMESPACE, selector: str = "") -> Body:
    return get_in(kind, name, ns=ns, selector=selector)


def spec(
    name: str, *, nodes: int = 2, image: str = IMAGE, env: dict[str, str] | None = None, gpu: int = 0
) -> JobSpec:
    return JobSpec(
        name=name,
        command=("python", "train.py"),
        nodes=nodes,
        kubeflow=KubeflowOptions(
            image=image,
            resources=Resources(cpu="1", memory="1Gi", gpu=gpu),
            env=env or {},
            no_capacity_after_seconds=5,
        ),
    )


def plan(name: str, restart_left: int | None) -> Plan:
    if restart_left is None:
        return Plan(
            job=f"{NAMESPACE}/{name}",
            rules=(
                PlannedRule(
                    index=0,
                    on=(CauseKind.PREEMPTED,),
                    action=Action.RESUBMIT,
                    budget=3,
                    enforcer=Enforcer.SUPERVISOR,
                ),
            ),
        )
    return Plan(
        job=f"{NAMESPACE}/{name}",
        rules=(
            PlannedRule(
                index=0,
                on=(CauseKind.NON_ZERO_EXIT, CauseKind.OUT_OF_MEMORY),
                action=Action.RESTART,
                budget=restart_left,
                enforcer=Enforcer.SCHEDULER,
            ),
        ),
    )


def create(job: str, *, restart_left: int | None = None, **kw: Any) -> tuple[str, Body]:
    body = build(Target(NAMESPACE, job, 1), spec(job, **kw), plan(job, restart_left))
    done = subprocess.run(
        [KUBECTL, "create", "-o", "json", "-f", "-"],
        input=json.dumps(body),
        capture_output=True,
        text=True,
        check=False,
    )
    return body["metadata"]["name"], {
        "built": body,
        "returncode": done.returncode,
        "stdout": done.stdout,
        "stderr": done.stderr,
    }


def release(pj: str) -> None:
    kubectl(
        "patch",
        "pytorchjob",
        pj,
        "-n",
        NAMESPACE,
        "--type=merge",
        "-p",
        '{"spec":{"runPolicy":{"suspend":false}}}',
    )


def pods(pj: str) -> list[Body]:
    return list(get("pods", selector=f"training.kubeflow.org/job-name={pj}").get("items") or [])


def running(pj: str, count: int) -> bool:
    return sum(1 for p in pods(pj) if p["status"].get("phase") == "Running") >= count


def condition(pj: str, kind: str) -> bool:
    body = get("pytorchjob", pj)
    return any(
        c["type"] == kind and c["status"] == "True" for c in body.get("status", {}).get("conditions") or []
    )


def gone(pj: str) -> bool:
    return not pods(pj)


def annotate(pod: str, **values: str) -> None:
    kubectl(
        "annotate",
        "pod",
        pod,
        "-n",
        NAMESPACE,
        "--overwrite",
        *[f"lab.dispatch.io/{k.replace('_', '-')}={v}" for k, v in values.items()],
    )


def preempt(pod: str) -> None:
    preempt_in(NAMESPACE, pod, IMAGE)


# ---- scenarios -------------------------------------------------------------------------------


def sc_success(rec: Recording) -> None:
    pj, _ = create("success")
    release(pj)
    until("running", lambda: running(pj, 2))
    for p in sorted(pods(pj), key=lambda p: p["metadata"]["name"], reverse=True):  # workers first
        annotate(p["metadata"]["name"], exit_code="0")
    until("succeeded", lambda: condition(pj, "Succeeded"))


def sc_deleted(rec: Recording) -> None:
    """A person deletes the running PyTorchJob; dispatch's finalizer keeps it readable (with its
    deletionTimestamp) until dispatch lets go, which the recorder does after a moment."""
    pj, _ = create("deleted")
    release(pj)
    until("running", lambda: running(pj, 2))
    kubectl("delete", "pytorchjob", pj, "-n", NAMESPACE, "--wait=false")
    until("deleting", lambda: bool(get("pytorchjob", pj)["metadata"].get("deletionTimestamp")))
    time.sleep(2.0)
    let_go(NAMESPACE, "pytorchjobs")
    until("gone", lambda: gone(pj))


def sc_oom_never(rec: Recording) -> None:
    pj, _ = create("oom-never")
    release(pj)
    until("running", lambda: running(pj, 2))
    annotate(f"{pj}-master-0", exit_code="137", exit_reason="OOMKilled")
    until("failed", lambda: condition(pj, "Failed"))


def sc_exit_never(rec: Recording) -> None:
    pj, _ = create("exit-never")
    release(pj)
    until("running", lambda: running(pj, 2))
    annotate(f"{pj}-worker-0", exit_code="1")
    until("failed", lambda: condition(pj, "Failed"))


def sc_oom_onfailure(rec: Recording) -> None:
    """restart budget 1 (backoffLimit 2): an OOM restarts in place, an exit 1 reaches the limit."""
    pj, _ = create("oom-onfailure", restart_left=1)
    release(pj)
    until("running", lambda: running(pj, 2))
    annotate(f"{pj}-master-0", exit_code="137", exit_reason="OOMKilled")
    until(
        "restarted",
        lambda: any((p["status"].get("containerStatuses") or [{}])[0].get("restartCount") for p in pods(pj)),
    )
    time.sleep(1)
    annotate(f"{pj}-worker-0", exit_code="1")
    until("failed", lambda: condition(pj, "Failed"))


def sc_preempt_never(rec: Recording) -> None:
    pj, _ = create("preempt-never")
    release(pj)
    until("running", lambda: running(pj, 2))
    preempt(f"{pj}-worker-0")
    until("failed", lambda: condition(pj, "Failed"))
    until(
        "victim gone",
        lambda: (
            not any(
                p["metadata"]["name"] == f"{pj}-worker-0" and p["status"].get("phase") == "Failed"
                for p in pods(pj)
            )
        ),
        30,
    )


def sc_preempt_onfailure(rec: Recording) -> None:
    """Under OnFailure the training operator deletes and recreates the preempted pod by itself."""
    pj, _ = create("preempt-onfailure", restart_left=2)
    release(pj)
    until("running", lambda: running(pj, 2))
    uid = get("pod", f"{pj}-worker-0")["metadata"]["uid"]
    preempt(f"{pj}-worker-0")
    until("recreated", lambda: get("pod", f"{pj}-worker-0")["metadata"]["uid"] != uid, 60)
    time.sleep(2)


def sc_taint_never(rec: Recording) -> None:
    pj, _ = create("taint-never", nodes=1)
    release(pj)
    until("running", lambda: running(pj, 1))
    node = get("pod", f"{pj}-master-0")["spec"]["nodeName"]
    kubectl("taint", "node", node, "lab.dispatch.io/down=true:NoExecute")
    try:
        until("failed", lambda: condition(pj, "Failed"))
        time.sleep(2)
    finally:
        kubectl("taint", "node", node, "lab.dispatch.io/down=true:NoExecute-", check=False)


def sc_notready_deleted(rec: Recording) -> None:
    """Never, 1 node; its node stops heartbeating (kwok no longer manages it, as if its kubelet died)
    and, as soon as it is NotReady, the pod is deleted by someone: no DisruptionTarget, and no
    kubelet confirms the deletion."""
    pj, _ = create("notready-deleted", nodes=1)
    release(pj)
    until("running", lambda: running(pj, 1))
    pod = f"{pj}-master-0"
    node = get("pod", pod)["spec"]["nodeName"]
    kubectl("label", "node", node, "kwok.x-k8s.io/node-")
    try:
        until(
            "NotReady",
            lambda: (
                not any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in get("node", node, ns=None)["status"].get("conditions") or []
                )
            ),
            90,
        )
        kubectl("delete", "pod", pod, "-n", NAMESPACE, "--wait=false")
        until("failed", lambda: condition(pj, "Failed"), 30)
        time.sleep(2)
        rec.extra_objects.append(trim(get("node", node, ns=None)))
    finally:
        kubectl("label", "node", node, "kwok.x-k8s.io/node=fake", "--overwrite", check=False)


def kubelet_failure(job: str, **stage: str) -> Callable[[Recording], None]:
    """Never, 1 node; one of the lab's kwok stages, triggered by its annotation, fails the pod."""

    def run(rec: Recording) -> None:
        pj, _ = create(job, nodes=1)
        release(pj)
        until("running", lambda: running(pj, 1))
        annotate(f"{pj}-master-0", **stage)
        until("failed", lambda: condition(pj, "Failed"))
        time.sleep(1)

    return run


def sc_unschedulable(rec: Recording) -> None:
    pj, _ = create("unschedulable", nodes=1, gpu=64)
    release(pj)
    until(
        "unschedulable",
        lambda: any(
            c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
            for p in pods(pj)
            for c in p["status"].get("conditions") or []
        ),
    )
    time.sleep(1)


def sc_image_pull(rec: Recording) -> None:
    pj, _ = create("image-pull", nodes=1, image=UNPULLABLE)
    release(pj)
    time.sleep(6)


def sc_env_refused(rec: Recording) -> None:
    """An env name the PyTorchJob CRD accepts and the pod API refuses (built by hand: dispatch's
    builder refuses it itself)."""
    body = build(Target(NAMESPACE, "env-refused", 1), spec("env-refused", nodes=1), plan("env-refused", None))
    body["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["env"] = [
        {"name": "A=B", "value": "1"}
    ]
    kubectl("create", "-f", "-", input=json.dumps(body))
    release("env-refused-1")
    until("FailedCreatePod", lambda: "FailedCreatePod" in kubectl("get", "events", "-n", NAMESPACE), 30)
    time.sleep(1)


def sc_webhook_refused(rec: Recording) -> Body:
    """A name that is not a DNS-1035 label: the training operator's validating webhook refuses it."""
    _, answer = create("1-starts-with-a-digit", nodes=1)
    return answer


SCENARIOS: dict[str, tuple[str, Callable[[Recording], Any]]] = {
    "success": ("Never, 2 nodes; every container exits 0 (kwok lab-container-exit)", sc_success),
    "oom-never": ("Never; the master OOMKilled (exit 137)", sc_oom_never),
    "exit-never": ("Never; worker-0 exits 1", sc_exit_never),
    "oom-onfailure": (
        "OnFailure, restart budget 1 (backoffLimit 2); master OOM in place, then worker exit 1",
        sc_oom_onfailure,
    ),
    "deleted": (
        "Never; the running PyTorchJob deleted by a person (dispatch's finalizer holds it)",
        sc_deleted,
    ),
    "preempt-never": (
        "Never; worker-0 preempted by kube-scheduler (a lab-high pod needing the node)",
        sc_preempt_never,
    ),
    "preempt-onfailure": (
        "OnFailure; worker-0 preempted by kube-scheduler; the training operator recreates it",
        sc_preempt_onfailure,
    ),
    "taint-never": ("Never, 1 node; NoExecute taint on its node (taint-eviction controller)", sc_taint_never),
    "unschedulable": ("Never, 1 node asking for 64 GPUs: kube-scheduler cannot place it", sc_unschedulable),
    "node-shutdown": (
        "Never, 1 node; graceful node shutdown: DisruptionTarget TerminationByKubelet",
        kubelet_failure("node-shutdown", node_shutdown="true"),
    ),
    "deadline": (
        "Never, 1 node; the kubelet's activeDeadlineSeconds kill: pod reason DeadlineExceeded",
        kubelet_failure("deadline", deadline="true"),
    ),
    "notready-deleted": (
        "Never, 1 node; its node NotReady, then the pod deleted (no DisruptionTarget)",
        sc_notready_deleted,
    ),
    "image-pull": (
        "Never, 1 node, an image that never pulls (kwok stage on unpullable.invalid/)",
        sc_image_pull,
    ),
    "env-refused": (
        "an env name with '=': the PyTorchJob is accepted, every pod creation refused",
        sc_env_refused,
    ),
    "webhook-refused": (
        "a PyTorchJob name that is not a DNS-1035 label: the validating webhook refuses it",
        sc_webhook_refused,
    ),
}


def record(name: str) -> None:
    what, run = SCENARIOS[name]
    let_go(NAMESPACE, "pytorchjobs")
    kubectl("delete", "namespace", NAMESPACE, "--wait=true", "--timeout=60s", check=False)
    kubectl("create", "namespace", NAMESPACE)
    rec = Recording(name, what, NAMESPACE)
    rec.watch("pytorchjobs", "app.kubernetes.io/managed-by=dispatch")
    rec.watch("pods", "app.kubernetes.io/managed-by=dispatch")
    time.sleep(1.0)
    extra: Any = None
    try:
        extra = run(rec)
    finally:
        rec.stop()
        cleanup_preemptors(NAMESPACE)
    write(OUT, name, rec, {"training_operator": "v1.9.3", **({"create": extra} if extra is not None else {})})


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", nargs="*", choices=sorted(SCENARIOS))
    args = parser.parse_args()
    if "KUBECONFIG" not in os.environ:
        raise SystemExit("set KUBECONFIG to the lab's kubeconfig")
    for name in args.only or list(SCENARIOS):
        record(name)
    let_go(NAMESPACE, "pytorchjobs")
    kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)


if __name__ == "__main__":
    main()

"""The operator's outcomes on Kubeflow (the lab's real training operator, kube-scheduler and
kube-controller-manager): what fails and why, causes told apart, cancel that keeps the record,
delete that ends every object first."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest

from tests.integration.conftest import (
    OperatorProcess,
    ReleaseMonitor,
    apply,
    await_for,
    condition,
    dispatch_job,
    get_job,
    history,
    pytorchjobs,
    running_pj,
    settled,
)
from tests.support.kube import KubeCluster
from tests.support.lab import Kubeflow, Lab

pytestmark = pytest.mark.integration


def has_history(cluster: KubeCluster, namespace: str, job: str) -> bool:
    return bool((get_job(cluster, namespace, job).get("status") or {}).get("history"))


async def test_uncovered_cause_fails_the_job_with_that_cause(
    crds: KubeCluster, namespace: str, operator: Callable[..., OperatorProcess], kubeflow: Kubeflow
) -> None:
    operator()
    await asyncio.to_thread(apply, crds, namespace, dispatch_job("crash", nodes=1))
    name = await running_pj(crds, namespace, "crash", 1, kubeflow)
    await kubeflow.exit(namespace, name, 1)
    await asyncio.to_thread(
        crds.kubectl, "wait", "-n", namespace, "dispatchjob/crash", "--for=condition=Failed", "--timeout=60s"
    )
    body = await settled(crds, namespace, "crash")
    assert body["status"]["state"] == "failed"
    assert body["status"]["cause"]["kind"] == "non-zero-exit"
    assert body["status"]["cause"]["exitCode"] == 1
    assert history(body) == [("pending", "failed", 1, "non-zero-exit")]
    stalled = condition(body, "Stalled")
    assert stalled is not None
    assert stalled["reason"] == "Failed"
    assert "not covered by any rule" in stalled["message"]
    assert condition(body, "Reconciling") is None


async def test_a_pod_no_node_takes_is_named_in_status_long_before_no_capacity(
    crds: KubeCluster, namespace: str, operator: Callable[..., OperatorProcess]
) -> None:
    """More CPU than any node has: the pod stays Unschedulable. Status names it, with
    kube-scheduler's words and when the wait becomes no-capacity, within seconds (not at the end of
    the wait), with no Event of dispatch's own (kube-scheduler's FailedScheduling is on the pod);
    the job then fails no-capacity and the note goes."""
    operator()
    options = {"image": "pytorch/pytorch:2.4", "resources": {"cpu": "1000"}, "noCapacityAfterSeconds": 45}
    await asyncio.to_thread(
        apply, crds, namespace, dispatch_job("huge", nodes=1, extra_spec={"kubeflow": options})
    )

    def noted() -> str | None:
        status = get_job(crds, namespace, "huge").get("status") or {}
        note = status.get("observedNote")
        return str(note) if note and status.get("state") == "pending" else None

    note = await await_for("status to say why it does not run", noted)
    assert note.startswith("pod huge-1-master-0 unschedulable (no-capacity at "), note
    assert "Insufficient cpu" in note, note
    body = await settled(crds, namespace, "huge")
    assert body["status"]["state"] == "failed"
    assert body["status"]["cause"]["kind"] == "no-capacity"
    assert "Insufficient cpu" in body["status"]["cause"]["detail"]
    assert "observedNote" not in body["status"]
    items = json.loads(crds.kubectl("get", "events", "-n", namespace, "-o", "json"))["items"]
    ours = [e for e in items if e["involvedObject"]["name"] == "huge" and e["reason"] == "HeldOutside"]
    assert ours == []


async def test_exhausted_budget_fails_the_job(
    crds: KubeCluster,
    namespace: str,
    operator: Callable[..., OperatorProcess],
    kubeflow: Kubeflow,
    release_monitor: ReleaseMonitor,
) -> None:
    operator()
    manifest = dispatch_job("twice", nodes=1, rules=[{"on": ["preempted"], "budget": 1}])
    await asyncio.to_thread(apply, crds, namespace, manifest)
    await kubeflow.preempt(namespace, await running_pj(crds, namespace, "twice", 1, kubeflow))
    await kubeflow.preempt(namespace, await running_pj(crds, namespace, "twice", 2, kubeflow))
    body = await settled(crds, namespace, "twice")
    assert history(body) == [
        ("pending", "recovering", 2, "preempted"),
        ("recovering", "failed", 2, "preempted"),
    ]
    assert body["status"]["plan"]["rules"][0]["firings"] == 1
    failed = condition(body, "Failed")
    assert failed is not None
    assert failed["status"] == "True"
    assert "used its budget (1/1)" in failed["message"]
    assert len(await asyncio.to_thread(pytorchjobs, crds, namespace)) == 2
    assert release_monitor.max_live["twice"] == 1


async def test_oom_and_node_loss_are_told_apart_from_preemption(
    crds: KubeCluster, namespace: str, operator: Callable[..., OperatorProcess], kubeflow: Kubeflow
) -> None:
    operator()
    preempt_only = [{"on": ["preempted"], "budget": 2}]
    await asyncio.to_thread(apply, crds, namespace, dispatch_job("oom", nodes=1, rules=preempt_only))
    await kubeflow.oom(namespace, await running_pj(crds, namespace, "oom", 1, kubeflow))
    oom = await settled(crds, namespace, "oom")
    # Node loss through the real taint eviction (kube-controller-manager), one job at a time: the
    # scheduler may put two jobs' pods on one node (what a CI timeout fits), and the taint evicts
    # every pod of that node, the terminated one of "oom" too (its record, settled, stays as it
    # is). The taint is lifted once the job has seen it, so the next submissions have every node.
    node_rule = [{"on": ["node-lost"], "budget": 1}]
    for job, rules in (("lost", preempt_only), ("survivor", node_rule)):
        await asyncio.to_thread(apply, crds, namespace, dispatch_job(job, nodes=1, rules=rules))
        node = await kubeflow.taint_evict(namespace, await running_pj(crds, namespace, job, 1, kubeflow))
        await await_for(f"{job} past submission 1", partial(has_history, crds, namespace, job))
        await kubeflow.untaint(node)
    await kubeflow.succeed(namespace, await running_pj(crds, namespace, "survivor", 2, kubeflow))

    assert history(oom) == [("pending", "failed", 1, "out-of-memory")]
    assert history(await asyncio.to_thread(get_job, crds, namespace, "oom")) == history(oom)
    lost = await settled(crds, namespace, "lost")
    assert history(lost) == [("pending", "failed", 1, "node-lost")]
    survivor = await settled(crds, namespace, "survivor")
    assert history(survivor) == [
        ("pending", "recovering", 2, "node-lost"),
        ("recovering", "succeeded", 2, "none"),
    ]


async def test_cancel_keeps_the_record_and_names_the_actor(
    crds: KubeCluster, namespace: str, operator: Callable[..., OperatorProcess], kubeflow: Kubeflow
) -> None:
    operator()
    await asyncio.to_thread(apply, crds, namespace, dispatch_job("stopme"))
    name = await running_pj(crds, namespace, "stopme", 1, kubeflow)
    before = await asyncio.to_thread(get_job, crds, namespace, "stopme")
    # what the mutating webhook does on the update that cancels: name the requesting user
    patch = {
        "metadata": {"annotations": {"dispatch.dev/cancelled-by": "human:ada"}},
        "spec": {"cancel": True},
    }
    await asyncio.to_thread(
        crds.kubectl,
        "patch",
        "dispatchjob",
        "stopme",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        json.dumps(patch),
    )
    await asyncio.to_thread(
        crds.kubectl, "wait", "-n", namespace, "dispatchjob/stopme", "--for=condition=Failed", "--timeout=60s"
    )
    body = await settled(crds, namespace, "stopme")
    status = body["status"]
    assert status["state"] == "cancelled"
    assert status["history"][-1]["to"] == "cancelled"
    assert status["history"][-1]["actor"] == {"kind": "human", "id": "ada"}
    assert status["cancel"]["actor"] == {"kind": "human", "id": "ada"}
    # the record is kept: plan, submissions and the canonical are all still there
    assert status["plan"] == before["status"]["plan"]
    assert status["submissions"][0]["canonical"] == f"{namespace}/{name}"
    failed = condition(body, "Failed")
    assert failed is not None
    assert failed["reason"] == "Cancelled"
    assert failed["observedGeneration"] == body["metadata"]["generation"] == 2
    assert await asyncio.to_thread(pytorchjobs, crds, namespace) == []  # ended (deleted)


async def test_delete_ends_every_object_before_the_finalizer_goes(
    crds: KubeCluster, namespace: str, operator: Callable[..., OperatorProcess], kubeflow: Kubeflow, lab: Lab
) -> None:
    mark = lab.audit_mark()
    op = operator()
    await asyncio.to_thread(apply, crds, namespace, dispatch_job("gone"))
    name = await running_pj(crds, namespace, "gone", 1, kubeflow)
    assert len(await kubeflow.pods(namespace, name)) == 2
    body = await asyncio.to_thread(get_job, crds, namespace, "gone")
    assert "dispatch.dev/finalizer" in body["metadata"]["finalizers"]
    # stop the operator: the finalizer holds the object until an operator has ended its objects
    op.stop()
    await asyncio.to_thread(crds.kubectl, "delete", "dispatchjob", "gone", "-n", namespace, "--wait=false")
    await asyncio.sleep(1)
    held = await asyncio.to_thread(get_job, crds, namespace, "gone")
    assert held["metadata"]["deletionTimestamp"]
    assert len(await asyncio.to_thread(pytorchjobs, crds, namespace)) == 1
    operator()
    await asyncio.to_thread(
        crds.kubectl, "wait", "-n", namespace, "dispatchjob/gone", "--for=delete", "--timeout=60s"
    )
    assert await asyncio.to_thread(pytorchjobs, crds, namespace) == []
    # The garbage collector would delete them too once the DispatchJob is gone: the audit log
    # shows that the operator (the admin identity here) deleted the PyTorchJob, before that.
    deletes = [
        (e["user"]["username"], e["responseStatus"]["code"])
        for e in await asyncio.to_thread(lab.audit_writes, mark, namespace=namespace, resource="pytorchjobs")
        if e["verb"] == "delete" and e["objectRef"].get("name") == name
    ]
    assert ("dispatch-admin", 200) in deletes, deletes
    await await_for(
        f"{name}'s pods gone", lambda: not lab.pods(namespace, f"training.kubeflow.org/job-name={name}")
    )


async def test_settled_job_is_deleted_quickly(
    crds: KubeCluster, namespace: str, operator: Callable[..., OperatorProcess], kubeflow: Kubeflow
) -> None:
    operator()
    await asyncio.to_thread(apply, crds, namespace, dispatch_job("done", nodes=1))
    await kubeflow.succeed(namespace, await running_pj(crds, namespace, "done", 1, kubeflow))
    await settled(crds, namespace, "done")
    await asyncio.to_thread(
        crds.kubectl, "delete", "dispatchjob", "done", "-n", namespace, "--wait=true", "--timeout=30s"
    )


@pytest.mark.parametrize("operator_down", [False, True], ids=["seen-live", "while-down"])
async def test_a_pytorchjob_deleted_by_a_person_gives_one_record(
    crds: KubeCluster,
    namespace: str,
    operator: Callable[..., OperatorProcess],
    kubeflow: Kubeflow,
    operator_down: bool,
) -> None:
    """The same external act, the same record, whether or not the operator ran when it happened:
    dispatch's finalizer keeps the deleted PyTorchJob readable until the outcome is recorded, then
    dispatch lets it go (and the garbage collector takes its pods)."""
    op = operator()
    await asyncio.to_thread(apply, crds, namespace, dispatch_job("deleted", nodes=1))
    name = await running_pj(crds, namespace, "deleted", 1, kubeflow)
    if operator_down:
        op.kill()
    await asyncio.to_thread(crds.kubectl, "delete", "pytorchjob", name, "-n", namespace, "--wait=false")
    if operator_down:
        await asyncio.sleep(2)  # held by the finalizer meanwhile: nobody else may remove it
        (held,) = await asyncio.to_thread(pytorchjobs, crds, namespace)
        assert held["metadata"]["deletionTimestamp"]
        assert "dispatch.dev/record-before-delete" in held["metadata"]["finalizers"]
        op.start()
    body = await settled(crds, namespace, "deleted")
    status = body["status"]
    assert status["state"] == "cancelled"
    assert history(body)[-1][1] == "cancelled"
    assert status["history"][-1]["actor"]["kind"] == "scheduler"
    assert status["cause"]["detail"] == "cancelled on the scheduler, outside dispatch"
    await asyncio.to_thread(
        crds.kubectl, "wait", "-n", namespace, f"pytorchjob/{name}", "--for=delete", "--timeout=60s"
    )


@pytest.mark.parametrize("restart", [False, True], ids=["live", "across-a-restart"])
async def test_a_job_whose_ttl_has_passed_since_it_settled_is_exported_then_deleted(
    crds: KubeCluster,
    namespace: str,
    operator: Callable[..., OperatorProcess],
    kubeflow: Kubeflow,
    restart: bool,
) -> None:
    op = operator("--log-format=json")
    manifest = dispatch_job("expiring", nodes=1, extra_spec={"ttlSecondsAfterSettled": 5})
    await asyncio.to_thread(apply, crds, namespace, manifest)
    await kubeflow.succeed(namespace, await running_pj(crds, namespace, "expiring", 1, kubeflow))
    body = await settled(crds, namespace, "expiring")
    settled_at = body["status"]["settledAt"]  # written with the settle itself
    if restart:
        op.kill()  # within the time to live: the next operator counts it from the record
        assert (await asyncio.to_thread(get_job, crds, namespace, "expiring"))["status"]["settled"]
        op = operator("--log-format=json")
    await asyncio.to_thread(
        crds.kubectl, "wait", "-n", namespace, "dispatchjob/expiring", "--for=delete", "--timeout=90s"
    )
    lines = [json.loads(line) for line in op.log().splitlines() if line.startswith("{")]
    [exported] = [line["record"] for line in lines if "record" in line]
    assert exported["job"] == f"{namespace}/expiring"
    assert exported["state"] == "succeeded"
    assert exported["settledAt"] == settled_at[:19] + "Z"
    events = json.loads(
        await asyncio.to_thread(crds.kubectl, "get", "events.events.k8s.io", "-n", namespace, "-o", "json")
    )["items"]
    [expired] = [e for e in events if e.get("reason") == "Expired"]
    assert "succeeded in submission 1" in expired["note"]
    assert await asyncio.to_thread(pytorchjobs, crds, namespace) == []


def _described(cluster: KubeCluster, namespace: str, name: str) -> str:
    """``kubectl dispatch describe``, the plugin as installed beside this Python."""
    plugin = Path(sys.executable).parent / "kubectl-dispatch"
    args = [str(plugin), "describe", "-n", namespace, name, f"--kubeconfig={cluster.kubeconfig}"]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


async def test_a_settled_job_kept_slim_reads_back_unchanged_after_a_restart(
    crds: KubeCluster, namespace: str, operator: Callable[..., OperatorProcess], kubeflow: Kubeflow
) -> None:
    op = operator()
    await asyncio.to_thread(apply, crds, namespace, dispatch_job("kept", nodes=1))
    await kubeflow.succeed(namespace, await running_pj(crds, namespace, "kept", 1, kubeflow))
    before = await settled(crds, namespace, "kept")
    described = await asyncio.to_thread(_described, crds, namespace, "kept")
    op.stop()
    op = operator()  # keeps the settled job's slim view only, decided without its record
    await await_for("every job decided", lambda: "all 1 jobs known and decided" in op.log())
    after = await asyncio.to_thread(get_job, crds, namespace, "kept")
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]  # no write
    assert after["status"] == before["status"]
    assert await asyncio.to_thread(_described, crds, namespace, "kept") == described
    shown = await asyncio.to_thread(
        crds.kubectl, "get", "dj", "kept", "-n", namespace, "-o", "jsonpath={.status.state}"
    )
    assert shown == "succeeded"

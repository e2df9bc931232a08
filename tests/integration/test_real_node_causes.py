"""Dispatch's causes from a real kubelet: DispatchJobs ``kubectl apply``-ed, run by the operator
and the lab's kube-controller-manager (the ``job`` kind) or Kubeflow's training operator (the
``kubeflow`` kind), their pods placed by the pod options on the lab's real node
(tests.support.node) and its test image. What dispatch records is what a real process, cgroup,
container runtime, kube-scheduler and kubelet did, not what a kwok stage was told to write: each row
of the cause table in docs/kubeflow.md that a real node can produce here (an exit code, a death by
a signal, an OOM kill, a preemption with its grace period, in-place restarts through
CrashLoopBackOff, an image that cannot be pulled, a container that cannot be created, the
kubelet's own eviction) and a cancel that reaches the process as SIGTERM.

Run: ``.venv/bin/pytest -p no:cacheprovider tests/integration/test_real_node_causes.py``.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import OperatorProcess, apply, await_for, history, settled
from tests.support.builders import PREEMPTED_ONCE, SEED_HISTORY, lab_manifest
from tests.support.kube import KubeCluster
from tests.support.lab_setup import HIGH_PRIORITY, UNPULLABLE_IMAGE
from tests.support.node import RealNode

pytestmark = [pytest.mark.integration, pytest.mark.node]

SMALL = {"cpu": "100m", "memory": "256Mi"}
"""What a pod asks for on the real node: the machine is shared, and the node has two cores."""


def on_real_node(node: RealNode, **options: Any) -> dict[str, Any]:
    """``spec.job`` for the real node: its test image (a tag other than ``latest``, so the
    container's pull policy is ``IfNotPresent`` and the imported image is used), the placement's
    nodeSelector and toleration, and ``options`` on top."""
    placement = node.placement()
    return {
        "image": node.image,
        "resources": dict(SMALL),
        "nodeSelector": placement["nodeSelector"],
        "tolerations": placement["tolerations"],
        **options,
    }


def job_pods(cluster: KubeCluster, namespace: str, job: str) -> list[dict[str, Any]]:
    out = json.loads(
        cluster.kubectl("get", "pods", "-n", namespace, "-l", f"dispatch.dev/job={job}", "-o", "json")
    )
    items: list[dict[str, Any]] = out["items"]
    return items


@dataclass
class PodsSeen:
    """What a watch saw of a job's pods: each pod as last seen, by name (kept after the pod is
    deleted), and every update in order (a state that passes, such as CrashLoopBackOff)."""

    last: dict[str, dict[str, Any]] = field(default_factory=dict)
    updates: list[dict[str, Any]] = field(default_factory=list)

    def ended(self) -> list[dict[str, Any]]:
        return [p for p in self.last.values() if ended(p)]


@contextmanager
def watched_pods(cluster: KubeCluster, namespace: str, job: str) -> Iterator[PodsSeen]:
    """Every pod of ``job`` as seen by a watch: the stop of a failed submission deletes its Job,
    and its pod with it, moments after the kubelet reported the container's end."""
    seen = PodsSeen()
    argv = [
        cluster.kubectl_bin,
        f"--kubeconfig={cluster.kubeconfig}",
        "get",
        "pods",
        "-n",
        namespace,
        "-l",
        f"dispatch.dev/job={job}",
        "--watch",
        "-o",
        'jsonpath={@}{"\\n"}',
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:  # one pod a line: jsonpath's ``{@}`` is the object's JSON
            obj = json.loads(line)
            seen.updates.append(obj)
            if obj.get("status", {}).get("containerStatuses") or obj["metadata"]["name"] not in seen.last:
                seen.last[obj["metadata"]["name"]] = obj

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        yield seen
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        reader.join(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()


def terminated(pod: dict[str, Any]) -> tuple[int, str]:
    (status,) = pod["status"]["containerStatuses"]
    done = status["state"]["terminated"]
    return int(done["exitCode"]), str(done["reason"])


def ended(pod: dict[str, Any]) -> bool:
    statuses = pod.get("status", {}).get("containerStatuses") or ()
    return any("terminated" in (st.get("state") or {}) for st in statuses)


def ran_on_the_node(pod: dict[str, Any], node: RealNode) -> None:
    """The pod was placed on the real node, with the imported image and a policy that uses it
    (nothing can be pulled there)."""
    assert pod["spec"]["nodeName"] == node.name, "the pod must run on the real node, not on kwok's"
    (main,) = pod["spec"]["containers"]
    assert (main["image"], main["imagePullPolicy"]) == (node.image, "IfNotPresent")


async def run_settled(
    crds: KubeCluster, namespace: str, name: str, manifest: str, *, ends: int = 1
) -> tuple[dict[str, Any], PodsSeen]:
    """Apply ``manifest``, wait until the job is settled and ``ends`` of its pods were seen ended:
    (the DispatchJob, what the watch saw of its pods)."""
    with watched_pods(crds, namespace, name) as seen:
        await asyncio.to_thread(apply, crds, namespace, manifest)
        body = await settled(crds, namespace, name)
        await await_for(f"{ends} pod ends of {name} seen", lambda: len(seen.ended()) >= ends)
    return body, seen


async def test_an_exit_code_3_fails_the_job_naming_it(
    crds: KubeCluster, namespace: str, real_node: RealNode, operator: Callable[..., OperatorProcess]
) -> None:
    code = "import sys; print('failing with 3', flush=True); sys.exit(3)"
    operator("--backend", "job")
    manifest = lab_manifest(
        "job", "exit3", [], options=on_real_node(real_node), command=["python3", "-c", code]
    )
    body, seen = await run_settled(crds, namespace, "exit3", manifest)
    status = body["status"]
    (pod,) = seen.last.values()
    ran_on_the_node(pod, real_node)
    assert terminated(pod) == (3, "Error")
    assert status["state"] == "failed", status
    assert (status["cause"]["kind"], status["cause"]["exitCode"]) == ("non-zero-exit", 3), status["cause"]
    assert status["cause"].get("signal") is None, status["cause"]
    assert [s["cause"]["exitCode"] for s in status["submissions"]] == [3]
    assert history(body) == [("pending", "failed", 1, "non-zero-exit")]
    assert "failing with 3" in real_node.container_log(namespace, pod["metadata"]["name"])


async def test_an_oom_kill_is_out_of_memory_and_a_rule_resubmits_it(
    crds: KubeCluster, namespace: str, real_node: RealNode, operator: Callable[..., OperatorProcess]
) -> None:
    # Submission 1 writes 256 MiB of pages past its 64Mi limit (each page counts against the
    # memory cgroup as it is written); submission 2 reads its identity from the env the operator
    # gave it and exits 0.
    code = (
        "import os\n"
        "n = os.environ['DISPATCH_SUBMISSION']\n"
        "job = os.environ['DISPATCH_NAMESPACE'] + '/' + os.environ['DISPATCH_JOB']\n"
        "print('submission', n, 'of', job, flush=True)\n"
        "if n != '2':\n"
        "    blob = b'x' * (256 << 20)\n"
        "    print('survived', len(blob) >> 20, 'MiB', flush=True)\n"
    )
    rules: list[dict[str, Any]] = [{"on": ["out-of-memory"], "action": "resubmit", "budget": 1}]
    options = on_real_node(real_node, resources={"cpu": "100m", "memory": "64Mi"})
    operator("--backend", "job")
    manifest = lab_manifest("job", "oom", rules, options=options, command=["python3", "-c", code])
    body, seen = await run_settled(crds, namespace, "oom", manifest, ends=2)
    status = body["status"]
    pods = {p["metadata"]["labels"]["dispatch.dev/submission"]: p for p in seen.ended()}
    assert sorted(pods) == ["1", "2"], sorted(pods)
    for pod in pods.values():
        ran_on_the_node(pod, real_node)
    assert terminated(pods["1"]) == (137, "OOMKilled")
    assert terminated(pods["2"]) == (0, "Completed")
    assert f"submission 2 of {namespace}/oom" in real_node.container_log(
        namespace, pods["2"]["metadata"]["name"]
    )
    assert status["state"] == "succeeded", status
    oom = status["submissions"][0]["cause"]
    assert (oom["kind"], oom["exitCode"], oom.get("signal")) == ("out-of-memory", 137, 9), oom
    assert history(body) == [
        ("pending", "recovering", 2, "out-of-memory"),
        ("recovering", "succeeded", 2, "none"),
    ]
    assert status["plan"]["rules"][0]["firings"] == 1


def host_volume(crds: KubeCluster, namespace: str, path: Path) -> None:
    """A PersistentVolumeClaim ``out`` bound to a hostPath PersistentVolume at ``path``: a
    DispatchJob's volumes take claims, not hostPath, and a claim is how a pod reaches a host
    directory through them."""
    pv = f"{namespace}-out"
    crds.apply(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": pv},
            "spec": {
                "capacity": {"storage": "1Mi"},
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                "hostPath": {"path": str(path), "type": "DirectoryOrCreate"},
                "claimRef": {"namespace": namespace, "name": "out"},
            },
        }
    )
    crds.apply(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "out"},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "",
                "volumeName": pv,
                "resources": {"requests": {"storage": "1Mi"}},
            },
        },
        namespace=namespace,
    )


def sigterm_program(*, exits: bool = True, first_only: bool = False) -> str:
    """A program that waits for SIGTERM, its handler writing through the host directory ``/out``
    that the test reads: the file can only exist if SIGTERM came (SIGKILL cannot be handled), its
    second line only if the process still ran a second later (no SIGKILL right behind the
    SIGTERM). ``exits``: the handler then exits 0 (the training contract), else the process
    carries on until its grace period ends. ``first_only``: submissions after the first exit 0."""
    return (
        "import os, signal, sys, time\n"
        f"if {first_only} and os.environ['DISPATCH_SUBMISSION'] != '1':\n"
        "    print('submission', os.environ['DISPATCH_SUBMISSION'], 'resumes', flush=True)\n"
        "    sys.exit(0)\n"
        "def on_term(signum, frame):\n"
        "    out = open('/out/sigterm', 'w')\n"
        "    print('signal', signum, file=out, flush=True)\n"
        f"    if {exits}:\n"
        "        time.sleep(1)\n"
        "        print('cleaned up', file=out, flush=True)\n"
        "        raise SystemExit(0)\n"
        "signal.signal(signal.SIGTERM, on_term)\n"
        "open('/out/ready', 'w').close()\n"
        "while True:\n"
        "    signal.pause()\n"
    )


def with_host_dir(crds: KubeCluster, namespace: str, node: RealNode) -> tuple[Path, dict[str, Any]]:
    """A host directory mounted at ``/out`` (:func:`host_volume`) and the pod options for the real
    node with it (the grace period is the job's ``spec.stop.gracePeriodSeconds``)."""
    out = node.host_dir / namespace
    host_volume(crds, namespace, out)
    options = on_real_node(
        node,
        volumes=[{"name": "out", "persistentVolumeClaim": {"claimName": "out"}}],
        volumeMounts=[{"name": "out", "mountPath": "/out"}],
    )
    return out, options


async def test_a_cancel_reaches_the_process_as_sigterm_and_ends_the_job_cancelled(
    crds: KubeCluster, namespace: str, real_node: RealNode, operator: Callable[..., OperatorProcess]
) -> None:
    code = sigterm_program()
    out, options = with_host_dir(crds, namespace, real_node)
    operator("--backend", "job")
    manifest = lab_manifest("job", "graceful", [], options=options, command=["python3", "-c", code])
    await asyncio.to_thread(apply, crds, namespace, manifest)
    await await_for("the handler installed", (out / "ready").exists)
    (pod,) = job_pods(crds, namespace, "graceful")
    ran_on_the_node(pod, real_node)

    await asyncio.to_thread(
        crds.kubectl,
        "patch",
        "dispatchjob",
        "graceful",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"cancel": True}}),
    )
    body = await settled(crds, namespace, "graceful")

    status = body["status"]
    assert status["state"] == "cancelled", status
    assert history(body) == [("pending", "cancelled", 1, "none")]
    # The process's exit 0 from its handler is the stop's doing, not an outcome of submission 1.
    assert "cause" not in status["submissions"][0], status["submissions"]
    assert (out / "sigterm").read_text().splitlines() == ["signal 15", "cleaned up"]
    assert status["cause"]["stop"] == "graceful", status


async def test_a_warned_time_limit_reaches_the_process_as_sigterm_and_the_stop_is_graceful(
    crds: KubeCluster, namespace: str, real_node: RealNode, operator: Callable[..., OperatorProcess]
) -> None:
    """``warningSeconds`` on a Job: the supervisor begins the time limit's stop that early (the Job
    controller sends no warning), the kubelet gives the process SIGTERM, its handler writes a
    checkpoint and exits, and the record says the time limit ended it, gracefully."""
    out, options = with_host_dir(crds, namespace, real_node)
    operator("--backend", "job")
    command = ["python3", "-c", sigterm_program()]
    spec = {"timeLimitSeconds": 12, "stop": {"warningSeconds": 6}}
    manifest = lab_manifest("job", "warned", [], options=options, command=command, **spec)
    await asyncio.to_thread(apply, crds, namespace, manifest)
    await await_for("the handler installed", (out / "ready").exists)
    body = await settled(crds, namespace, "warned")

    status = body["status"]
    assert history(body) == [("pending", "failed", 1, "time-limit")]
    assert status["plan"]["timeLimit"]["enforcer"] == "supervisor"
    assert status["cause"]["stop"] == "graceful", status
    assert (out / "sigterm").read_text().splitlines() == ["signal 15", "cleaned up"]


def waited(pod: dict[str, Any]) -> dict[str, Any]:
    """The main container's ``waiting`` state (empty when it is not waiting)."""
    statuses = pod.get("status", {}).get("containerStatuses") or ()
    return dict(statuses[0].get("state", {}).get("waiting") or {}) if statuses else {}


async def test_a_death_by_a_signal_is_the_runtimes_exit_code_and_no_signal(
    crds: KubeCluster, namespace: str, real_node: RealNode, operator: Callable[..., OperatorProcess]
) -> None:
    # A real SIGSEGV (a read of address 0): the kernel forces it even on the container's PID 1,
    # which ignores the signals sent to it from inside its PID namespace.
    code = "import ctypes; print('reading address 0', flush=True); ctypes.string_at(0)"
    operator("--backend", "job")
    options = on_real_node(real_node)
    manifest = lab_manifest("job", "segv", [], options=options, command=["python3", "-c", code])
    body, seen = await run_settled(crds, namespace, "segv", manifest)

    (pod,) = seen.last.values()
    ran_on_the_node(pod, real_node)
    (main,) = pod["status"]["containerStatuses"]
    # containerd reports a death by signal N as the exit status 128 + N; the kubelet's reason is
    # Error, and it never fills the termination's `signal`: an exit(139) reads the same.
    term = main["state"]["terminated"]
    assert (term["exitCode"], term["reason"], term.get("signal")) == (139, "Error", None), term
    cause = body["status"]["cause"]
    assert (cause["kind"], cause["exitCode"], cause.get("signal")) == ("non-zero-exit", 139, None), cause
    assert history(body) == [("pending", "failed", 1, "non-zero-exit")]
    assert "reading address 0" in real_node.container_log(namespace, pod["metadata"]["name"])


def preemptor(node: RealNode, namespace: str, job: str) -> dict[str, Any]:
    """A ``lab-high`` pod for the real node that refuses to share it with submission 1 of ``job``
    (required pod anti-affinity): kube-scheduler's only way to place it is to preempt that pod."""
    return node.pod(
        "preemptor",
        ["python3", "-c", "import signal; signal.pause()"],
        namespace=namespace,
        priorityClassName=HIGH_PRIORITY,
        terminationGracePeriodSeconds=0,
        affinity={
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "labelSelector": {
                            "matchLabels": {"dispatch.dev/job": job, "dispatch.dev/submission": "1"}
                        },
                        "topologyKey": "kubernetes.io/hostname",
                    }
                ]
            }
        },
        container={"resources": {"requests": dict(SMALL)}},
    )


@pytest.mark.parametrize(
    ("handler", "grace", "lines", "exit"),
    [
        # The training contract: on SIGTERM write a checkpoint and exit (0).
        ("exits", 30, ["signal 15", "cleaned up"], (0, "Completed")),
        # A process that goes on after SIGTERM is killed when its grace period ends.
        ("ignores", 3, ["signal 15"], (137, "Error")),
    ],
)
async def test_a_preemption_gives_sigterm_and_the_grace_period_and_is_preempted(
    crds: KubeCluster,
    namespace: str,
    real_node: RealNode,
    operator: Callable[..., OperatorProcess],
    handler: str,
    grace: int,
    lines: list[str],
    exit: tuple[int, str],
) -> None:
    # Submission 1 waits for SIGTERM (sigterm_program); submission 2 exits 0: the preemption is
    # recovered by the rule.
    code = sigterm_program(exits=handler == "exits", first_only=True)
    out, options = with_host_dir(crds, namespace, real_node)
    operator("--backend", "job")
    command = ["python3", "-c", code]
    manifest = lab_manifest(
        "job",
        "preempted",
        PREEMPTED_ONCE,
        options=options,
        command=command,
        stop={"gracePeriodSeconds": grace},
    )
    with watched_pods(crds, namespace, "preempted") as seen:
        await asyncio.to_thread(apply, crds, namespace, manifest)
        await await_for("the handler installed", (out / "ready").exists)
        await asyncio.to_thread(crds.apply, preemptor(real_node, namespace, "preempted"), namespace=namespace)
        body = await settled(crds, namespace, "preempted")
        await await_for("both pods' ends seen", lambda: len(seen.ended()) >= 2)

    pods = {p["metadata"]["labels"]["dispatch.dev/submission"]: p for p in seen.ended()}
    for pod in pods.values():
        ran_on_the_node(pod, real_node)
    victim = pods["1"]
    disruption = next(c for c in victim["status"]["conditions"] if c["type"] == "DisruptionTarget")
    assert (disruption["status"], disruption["reason"]) == ("True", "PreemptionByScheduler"), disruption
    assert terminated(victim) == exit
    assert (out / "sigterm").read_text().splitlines() == lines
    status = body["status"]
    assert status["state"] == "succeeded", status
    assert history(body) == SEED_HISTORY
    preempted = status["submissions"][0]["cause"]
    assert preempted["kind"] == "preempted", preempted
    assert "PreemptionByScheduler" in preempted["detail"], preempted
    assert terminated(pods["2"]) == (0, "Completed")


def job_conditions(crds: KubeCluster, namespace: str, name: str) -> dict[str, str]:
    job = crds.get("job", name, namespace)
    return {c["type"]: c["status"] for c in job.get("status", {}).get("conditions") or ()}


async def test_a_preempted_program_that_exits_0_is_preempted_though_its_job_completed(
    crds: KubeCluster, namespace: str, real_node: RealNode, operator: Callable[..., OperatorProcess]
) -> None:
    # While no operator runs, the preempted program exits 0 on its SIGTERM (the training
    # contract): its pod is Succeeded and the Job controller counts the Job Complete. A finalizer
    # of this test keeps the pod (as any controller's finalizer may), so the operator that starts
    # next sees it: its DisruptionTarget, set before the program ended, says why it ended.
    out, options = with_host_dir(crds, namespace, real_node)
    op = operator("--backend", "job")
    command = ["python3", "-c", sigterm_program(first_only=True)]
    manifest = lab_manifest("job", "late", PREEMPTED_ONCE, options=options, command=command)
    await asyncio.to_thread(apply, crds, namespace, manifest)
    await await_for("the handler installed", (out / "ready").exists)
    (pod,) = job_pods(crds, namespace, "late")
    name = pod["metadata"]["name"]
    keep = json.dumps([{"op": "add", "path": "/metadata/finalizers/-", "value": "lab.dispatch.io/keep"}])
    await asyncio.to_thread(crds.kubectl, "patch", "pod", name, "-n", namespace, "--type=json", "-p", keep)
    try:
        op.kill()
        await asyncio.to_thread(crds.apply, preemptor(real_node, namespace, "late"), namespace=namespace)
        await await_for(
            "the Job complete", lambda: job_conditions(crds, namespace, "late-1").get("Complete") == "True"
        )
        op.start()
        body = await settled(crds, namespace, "late")
        victim = crds.get("pod", name, namespace)
    finally:
        await asyncio.to_thread(
            crds.kubectl,
            "patch",
            "pod",
            name,
            "-n",
            namespace,
            "--type=merge",
            "-p",
            '{"metadata":{"finalizers":null}}',
        )

    assert victim["status"]["phase"] == "Succeeded"
    assert terminated(victim) == (0, "Completed")
    assert any(c["type"] == "DisruptionTarget" for c in victim["status"]["conditions"])
    assert (out / "sigterm").read_text().splitlines() == ["signal 15", "cleaned up"]
    assert history(body) == SEED_HISTORY
    preempted = body["status"]["submissions"][0]["cause"]
    assert preempted["kind"] == "preempted", preempted


async def test_in_place_restarts_wait_in_crashloopbackoff_and_fire_the_restart_rule(
    crds: KubeCluster, namespace: str, real_node: RealNode, operator: Callable[..., OperatorProcess]
) -> None:
    # A PyTorchJob under the native restart rule (restartPolicy OnFailure, budget 2): runs 1 and 2
    # fail with 1 and run 3 succeeds, counting its runs in the pod's emptyDir (kept across in-place
    # restarts). The kubelet restarts a container at once the first time, and after a back-off
    # (waiting in CrashLoopBackOff) from the second time on.
    code = (
        "import os, sys\n"
        "runs = len(os.listdir('/scratch')) + 1\n"
        "open(f'/scratch/run{runs}', 'w').close()\n"
        "print('run', runs, flush=True)\n"
        "sys.exit(1 if runs < 3 else 0)\n"
    )
    rules: list[dict[str, Any]] = [
        {"on": ["non-zero-exit", "out-of-memory"], "action": "restart", "budget": 2}
    ]
    options = on_real_node(
        real_node,
        volumes=[{"name": "scratch", "emptyDir": {}}],
        volumeMounts=[{"name": "scratch", "mountPath": "/scratch"}],
    )
    operator("--backend", "kubeflow")
    manifest = lab_manifest("kubeflow", "crashloop", rules, options=options, command=["python3", "-c", code])
    body, seen = await run_settled(crds, namespace, "crashloop", manifest)

    (pod,) = seen.last.values()
    ran_on_the_node(pod, real_node)
    (main,) = pod["status"]["containerStatuses"]
    assert main["restartCount"] == 2
    assert terminated(pod) == (0, "Completed")
    # The earlier runs' ends show only while the pod runs: once it is done, the kubelet removes
    # the dead containers and lastState is empty. dispatch counts each restart when it shows.
    lasts = [
        (st["restartCount"], st["lastState"]["terminated"]["exitCode"])
        for p in seen.updates
        for st in p["status"].get("containerStatuses") or ()
        if "terminated" in (st.get("lastState") or {})
    ]
    assert {(1, 1), (2, 1)} <= set(lasts), lasts
    backoff = [waited(p) for p in seen.updates if waited(p).get("reason") == "CrashLoopBackOff"]
    assert backoff, "the kubelet's back-off before the second restart"
    assert "back-off 10s restarting failed container" in backoff[0]["message"], backoff[0]
    status = body["status"]
    assert status["state"] == "succeeded", status
    assert history(body) == [("pending", "succeeded", 1, "none")]
    assert status["plan"]["rules"][0]["firings"] == 2
    assert status["submissions"][0]["restarts"] == 2
    log = real_node.container_log(namespace, pod["metadata"]["name"], container=main["name"])
    assert "run 3" in log


@pytest.mark.parametrize(
    ("name", "image", "command", "reason", "named"),
    [
        # Pulled from nowhere: no registry is reachable, and the name does not resolve.
        ("unpullable", UNPULLABLE_IMAGE, ["python3", "-c", "pass"], "ErrImagePull", UNPULLABLE_IMAGE),
        # The runtime cannot start a program that does not exist.
        ("no-program", None, ["/no/such/program"], "StartError", "/no/such/program"),
    ],
)
async def test_a_container_that_cannot_start_is_launch_failed(
    crds: KubeCluster,
    namespace: str,
    real_node: RealNode,
    operator: Callable[..., OperatorProcess],
    name: str,
    image: str | None,
    command: list[str],
    reason: str,
    named: str,
) -> None:
    options = on_real_node(real_node, **({"image": image} if image else {}))
    operator("--backend", "job")
    manifest = lab_manifest("job", name, [], options=options, command=command)
    body, seen = await run_settled(crds, namespace, name, manifest, ends=0 if image else 1)

    (pod,) = seen.last.values()
    assert pod["spec"]["nodeName"] == real_node.name
    states = [waited(p) for p in seen.updates] + [
        dict(p["status"]["containerStatuses"][0]["state"].get("terminated") or {}) for p in seen.ended()
    ]
    said = next(s for s in states if s.get("reason") == reason)
    assert named in said["message"], said
    status = body["status"]
    assert status["state"] == "failed", status
    assert history(body) == [("pending", "failed", 1, "launch-failed")]
    assert reason in status["cause"]["detail"], status["cause"]
    assert named in status["cause"]["detail"], status["cause"]


@pytest.mark.parametrize("by", ["kubelet", "eviction-api"])
async def test_an_eviction_is_preempted_unless_the_pod_outgrew_its_own_limit(
    crds: KubeCluster,
    namespace: str,
    real_node: RealNode,
    operator: Callable[..., OperatorProcess],
    by: str,
) -> None:
    # kubelet: its eviction manager evicts a pod whose emptyDir outgrows its sizeLimit (the same
    # reason, Evicted, as a node-pressure eviction, but no DisruptionTarget). eviction-api: what
    # `kubectl drain` does; the process (PID 1, no handler: it ignores SIGTERM) is killed at the
    # end of its 2 s grace period.
    code = (
        "import signal\n"
        "with open('/scratch/blob', 'wb') as f:\n"
        f"    f.write(b'x' * {8 << 20 if by == 'kubelet' else 0})\n"
        "signal.pause()\n"
    )
    options = on_real_node(
        real_node,
        volumes=[{"name": "scratch", "emptyDir": {"sizeLimit": "1Mi"}}],
        volumeMounts=[{"name": "scratch", "mountPath": "/scratch"}],
    )
    operator("--backend", "job")
    manifest = lab_manifest(
        "job", "evicted", [], options=options, command=["python3", "-c", code], stop={"gracePeriodSeconds": 2}
    )
    with watched_pods(crds, namespace, "evicted") as seen:
        await asyncio.to_thread(apply, crds, namespace, manifest)
        if by == "eviction-api":
            (pod,) = await await_for(
                "the pod running",
                lambda: [p for p in seen.last.values() if p["status"].get("phase") == "Running"],
            )
            assert crds.lab is not None
            await asyncio.to_thread(crds.lab.evict_pod, namespace, pod["metadata"]["name"])
        body = await settled(crds, namespace, "evicted")
        await await_for("the pod's end seen", seen.ended)

    (pod,) = seen.last.values()
    ran_on_the_node(pod, real_node)
    assert pod["status"]["phase"] == "Failed", pod["status"]
    conditions = {c["type"]: c for c in pod["status"]["conditions"]}
    if by == "kubelet":
        assert pod["status"]["reason"] == "Evicted", pod["status"]
        assert 'Usage of EmptyDir volume "scratch" exceeds the limit' in pod["status"]["message"]
        assert "DisruptionTarget" not in conditions, conditions
        said = "Evicted"
    else:
        disruption = conditions["DisruptionTarget"]
        assert (disruption["status"], disruption["reason"]) == ("True", "EvictionByEvictionAPI")
        assert terminated(pod) == (137, "Error")
        said = "EvictionByEvictionAPI"
    status = body["status"]
    assert status["state"] == "failed", status
    # Over its own limit, the job would outgrow it again: not a preemption a rule resubmits.
    cause = "unknown" if by == "kubelet" else "preempted"
    assert history(body) == [("pending", "failed", 1, cause)]
    assert said in status["cause"]["detail"], status["cause"]

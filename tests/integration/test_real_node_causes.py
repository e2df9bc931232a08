"""Dispatch's causes from a real kubelet: DispatchJobs of the ``job`` kind, ``kubectl apply``-ed,
run by the operator and the lab's kube-controller-manager, their pods placed by the pod options on
the lab's real node (tests.support.node) and its test image. What dispatch records is what a real
process, cgroup and kubelet did, not what a kwok stage was told to write: an exit code, an OOM kill
answered by a rule (and the identity env read by the next submission's process), and a cancel that
reaches the process as SIGTERM before the grace period ends.

Run: ``.venv/bin/pytest -p no:cacheprovider tests/integration/test_real_node_causes.py``.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import OperatorProcess, apply, await_for, history, settled
from tests.support.builders import lab_manifest
from tests.support.kube import KubeCluster
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


@contextmanager
def watched_pods(cluster: KubeCluster, namespace: str, job: str) -> Iterator[dict[str, dict[str, Any]]]:
    """Every pod of ``job`` as last seen by a watch, by name, kept after the pod is deleted: the
    stop of a failed submission deletes its Job, and its pod with it, moments after the kubelet
    reported the container's end."""
    seen: dict[str, dict[str, Any]] = {}
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
            if obj.get("status", {}).get("containerStatuses") or obj["metadata"]["name"] not in seen:
                seen[obj["metadata"]["name"]] = obj

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


async def test_an_exit_code_3_fails_the_job_naming_it(
    crds: KubeCluster, namespace: str, real_node: RealNode, operator: Callable[..., OperatorProcess]
) -> None:
    code = "import sys; print('failing with 3', flush=True); sys.exit(3)"
    operator("--backend", "job")
    manifest = lab_manifest(
        "job", "exit3", [], options=on_real_node(real_node), command=["python3", "-c", code]
    )
    with watched_pods(crds, namespace, "exit3") as seen:
        await asyncio.to_thread(apply, crds, namespace, manifest)
        body = await settled(crds, namespace, "exit3")
        await await_for("the pod's end seen", lambda: [p for p in seen.values() if ended(p)])

    status = body["status"]
    (pod,) = seen.values()
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
    with watched_pods(crds, namespace, "oom") as seen:
        await asyncio.to_thread(apply, crds, namespace, manifest)
        body = await settled(crds, namespace, "oom")
        await await_for("both pods' ends seen", lambda: len([p for p in seen.values() if ended(p)]) == 2)

    status = body["status"]
    pods = {p["metadata"]["labels"]["dispatch.dev/submission"]: p for p in seen.values() if ended(p)}
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


TRAPS_SIGTERM = (
    "import signal, time\n"
    "def on_term(signum, frame):\n"
    "    out = open('/out/sigterm', 'w')\n"
    "    print('signal', signum, file=out, flush=True)\n"
    "    time.sleep(1)\n"
    "    print('cleaned up', file=out, flush=True)\n"
    "    raise SystemExit(0)\n"
    "signal.signal(signal.SIGTERM, on_term)\n"
    "open('/out/ready', 'w').close()\n"
    "while True:\n"
    "    signal.pause()\n"
)
"""A program whose SIGTERM handler writes through a host directory that the test reads: the file
can only exist if SIGTERM came (SIGKILL cannot be handled), its second line only if the process
still ran a second later (no SIGKILL right behind the SIGTERM)."""


async def trapping_job(
    crds: KubeCluster,
    namespace: str,
    real_node: RealNode,
    operator: Callable[..., OperatorProcess],
    name: str,
    **spec: Any,
) -> Path:
    """A DispatchJob ``name`` of :data:`TRAPS_SIGTERM` on the real node, its handler installed;
    returns the host directory it writes to."""
    out = real_node.host_dir / f"{namespace}-{name}"
    host_volume(crds, namespace, out)
    options = on_real_node(
        real_node,
        volumes=[{"name": "out", "persistentVolumeClaim": {"claimName": "out"}}],
        volumeMounts=[{"name": "out", "mountPath": "/out"}],
    )
    operator("--backend", "job")
    manifest = lab_manifest(
        "job", name, [], options=options, command=["python3", "-c", TRAPS_SIGTERM], **spec
    )
    await asyncio.to_thread(apply, crds, namespace, manifest)
    await await_for("the handler installed", (out / "ready").exists)
    (pod,) = job_pods(crds, namespace, name)
    ran_on_the_node(pod, real_node)
    return out


async def test_a_cancel_reaches_the_process_as_sigterm_and_ends_the_job_cancelled(
    crds: KubeCluster, namespace: str, real_node: RealNode, operator: Callable[..., OperatorProcess]
) -> None:
    out = await trapping_job(crds, namespace, real_node, operator, "graceful")
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
    spec = {"timeLimitSeconds": 12, "stop": {"warningSeconds": 6}}
    out = await trapping_job(crds, namespace, real_node, operator, "warned", **spec)
    body = await settled(crds, namespace, "warned")

    status = body["status"]
    assert history(body) == [("pending", "failed", 1, "time-limit")]
    assert status["plan"]["timeLimit"]["enforcer"] == "supervisor"
    assert status["cause"]["stop"] == "graceful", status
    assert (out / "sigterm").read_text().splitlines() == ["signal 15", "cleaned up"]

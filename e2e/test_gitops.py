"""GitOps health by the tools' own code, on real DispatchJobs from the lab, in every state.

A watch records every version of the namespace's DispatchJobs that the API server held while the
operator (a process under an admin identity) takes four jobs through their lives on the lab: one is
preempted by the real kube-scheduler, resubmitted and succeeds (then is deleted), one runs out of
memory (no rule covers it), one is cancelled, one is refused (a rule nobody can enforce). Each
version is judged by Flux's kstatus (``sigs.k8s.io/cli-utils/pkg/kstatus``) and by Argo CD's
health script in gopher-lua (tests/support/gitops.py), and both verdicts must be the ones the
table in docs/gitops.md ("What each tool says") gives for that version's state; every row of the
table must be seen.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import (
    DISPATCH_CRD,
    OperatorProcess,
    await_for,
    dispatch_job,
    get_job,
    pytorchjobs,
)
from tests.support import gitops
from tests.support.builders import REPO
from tests.support.kube import KubeCluster
from tests.support.lab import Kubeflow

pytestmark = pytest.mark.e2e

TABLE_TITLE = "### What each tool says"


class Versions:
    """Every version of the namespace's DispatchJobs, from ``kubectl get --watch -o json``."""

    def __init__(self, cluster: KubeCluster, namespace: str) -> None:
        self.objects: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._proc = subprocess.Popen(
            [
                cluster.kubectl_bin,
                f"--kubeconfig={cluster.kubeconfig}",
                "get",
                "dispatchjobs",
                f"--namespace={namespace}",
                "--watch",
                "--output=json",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        decoder = json.JSONDecoder()
        buffer = ""
        for line in self._proc.stdout:
            buffer += line
            while buffer.strip():
                try:
                    obj, end = decoder.raw_decode(buffer.lstrip())
                except json.JSONDecodeError:
                    break
                buffer = buffer.lstrip()[end:]
                with self._lock:
                    self.objects.append(obj)

    def of(self, name: str) -> list[dict[str, Any]]:
        with self._lock:
            return [o for o in self.objects if o["metadata"]["name"] == name]

    def close(self) -> None:
        self._proc.terminate()
        self._proc.wait(timeout=10)
        self._thread.join(timeout=10)
        for pipe in (self._proc.stdout, self._proc.stderr):
            if pipe is not None:
                pipe.close()


def state_of(obj: Mapping[str, Any]) -> str:
    """The row of docs/gitops.md's table a version belongs to."""
    meta = obj["metadata"]
    status: Mapping[str, Any] = obj.get("status") or {}
    if meta.get("deletionTimestamp"):
        return "being deleted"
    if not status:
        return "no status yet"
    if status.get("observedGeneration", 0) < meta.get("generation", 0):
        return "not yet observed"
    state = status.get("observedState") or status.get("state")  # what kubectl get dj shows
    if state is None:
        stalled = any(
            c["type"] == "Stalled" and c["status"] == "True" for c in status.get("conditions") or ()
        )
        return "refused" if stalled else "no state"
    if state == "pending" and not status.get("submissions"):
        return "pending, nothing authorized yet"
    if state == "cancelled" and not status.get("settled"):
        return "cancelling"  # every object ended, the record not settled yet: still cancelling
    if state in ("succeeded", "failed") and not status.get("settled"):
        return f"{state}, ending its objects"
    return str(state)


def documented() -> dict[str, tuple[str, str]]:
    """docs/gitops.md's table: state -> (kstatus, Argo CD)."""
    lines = (REPO / "docs" / "gitops.md").read_text().splitlines()
    start = lines.index(TABLE_TITLE)
    rows: dict[str, tuple[str, str]] = {}
    for line in lines[start + 1 :]:
        if line.startswith("#"):
            break
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or set(cells[0]) <= {"-", " ", ":"} or cells[0] == "DispatchJob":
            continue
        rows[cells[0]] = (cells[1], cells[2])
    assert rows, f"no table under {TABLE_TITLE!r} in docs/gitops.md"
    return rows


async def test_kstatus_and_argocd_on_every_state_agree_with_the_docs(
    kube_cluster: KubeCluster,
    namespace: str,
    kubeflow: Kubeflow,
    tmp_path: Path,
) -> None:
    cluster = kube_cluster
    table = documented()
    # The DispatchJob CRD as the repository generates it (here no chart release installs it).
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(DISPATCH_CRD))
    cluster.wait_established("dispatchjobs.dispatch.dev")
    versions = Versions(cluster, namespace)
    try:
        await judge_every_version(cluster, namespace, kubeflow, versions, table, tmp_path)
    finally:
        versions.close()


async def judge_every_version(
    cluster: KubeCluster,
    namespace: str,
    kubeflow: Kubeflow,
    versions: Versions,
    table: dict[str, tuple[str, str]],
    tmp_path: Path,
) -> None:

    def apply(manifest: str) -> None:
        cluster.kubectl("apply", f"--namespace={namespace}", "-f", "-", input=manifest)

    # Created before the operator runs: the watch sees each job without any status first.
    apply(dispatch_job("lifecycle"))
    apply(dispatch_job("oom", nodes=1))
    apply(dispatch_job("cancel", nodes=1))
    apply(dispatch_job("refused", rules=[{"on": ["preempted"], "action": "restart", "budget": 2}]))
    await await_for("the watch", lambda: len({o["metadata"]["name"] for o in versions.objects}) == 4)
    op = OperatorProcess(
        kubeconfig=cluster.kubeconfig, namespace=namespace, log_path=tmp_path / "operator.log"
    )
    op.start()
    try:
        await asyncio.gather(
            lifecycle(cluster, namespace, kubeflow, versions),
            oom(cluster, namespace, kubeflow),
            cancel(cluster, namespace, kubeflow, versions),
            await_for(
                "refused",
                lambda: any(state_of(o) == "refused" for o in versions.of("refused")),
            ),
        )
        # Deleted: the operator's finalizer holds it while it ends the job's objects.
        cluster.kubectl("delete", "dispatchjob", "lifecycle", f"--namespace={namespace}", "--wait=false")
        await await_for(
            "lifecycle gone",
            lambda: (
                not cluster.kubectl(
                    "get",
                    "dispatchjob",
                    "lifecycle",
                    f"--namespace={namespace}",
                    "--ignore-not-found",
                    "-o",
                    "name",
                ).strip()
            ),
        )
        await asyncio.sleep(1)  # the watch's last events
    finally:
        op.stop()

    seen = list(versions.objects)
    kstatus = gitops.kstatus(seen)
    argocd = gitops.argocd(seen)
    verdicts: dict[str, set[tuple[str, str]]] = {}
    wrong: list[str] = []
    for obj, k, a in zip(seen, kstatus, argocd, strict=True):
        row = state_of(obj)
        verdicts.setdefault(row, set()).add((k["status"], a["status"]))
        expected = table.get(row)
        if expected is None:
            wrong.append(f"{obj['metadata']['name']}: state {row!r} is not in docs/gitops.md's table")
        elif (k["status"], a["status"]) != expected:
            wrong.append(
                f"{obj['metadata']['name']} ({row}): kstatus {k['status']} ({k['message']}), "
                f"Argo CD {a['status']} ({a['message']}); the docs say {expected}"
            )
    assert not wrong, "\n".join(wrong)
    missing = set(table) - set(verdicts)
    assert not missing, f"rows of the docs' table never seen on the lab: {sorted(missing)}; seen: {verdicts}"
    print(f"\n{len(seen)} versions judged: " + json.dumps({r: sorted(v) for r, v in verdicts.items()}))


async def released(cluster: KubeCluster, namespace: str, job: str, submission: int) -> str:
    def probe() -> str | None:
        for pj in pytorchjobs(cluster, namespace):
            labels = pj["metadata"].get("labels") or {}
            suspended = ((pj.get("spec") or {}).get("runPolicy") or {}).get("suspend")
            mine = labels.get("dispatch.dev/job") == job
            if mine and labels.get("dispatch.dev/submission") == str(submission) and not suspended:
                return str(pj["metadata"]["name"])
        return None

    found: str = await await_for(f"{job}: submission {submission} released", probe, within=120)
    return found


async def until_state(
    cluster: KubeCluster, namespace: str, job: str, state: str, settled: bool = False
) -> None:
    def probe() -> bool:
        status = get_job(cluster, namespace, job).get("status") or {}
        return status.get("state") == state and (not settled or bool(status.get("settled")))

    await await_for(f"{job} {state}", probe, within=120)


async def until_shown(cluster: KubeCluster, namespace: str, job: str, state: str) -> None:
    """Until ``kubectl get dj`` shows ``state`` (``status.observedState``)."""

    def probe() -> bool:
        return (get_job(cluster, namespace, job).get("status") or {}).get("observedState") == state

    await await_for(f"{job} shows {state}", probe, within=120)


async def lifecycle(cluster: KubeCluster, namespace: str, kubeflow: Kubeflow, versions: Versions) -> None:
    first = await released(cluster, namespace, "lifecycle", 1)
    await asyncio.wait_for(kubeflow.wait_pods(namespace, first, 2), 120)
    await until_shown(cluster, namespace, "lifecycle", "running")  # the row "running" is seen
    await kubeflow.preempt(namespace, first)
    second = await released(cluster, namespace, "lifecycle", 2)
    await asyncio.wait_for(kubeflow.wait_pods(namespace, second, 2), 120)
    await kubeflow.succeed(namespace, second)
    await until_state(cluster, namespace, "lifecycle", "succeeded", settled=True)


async def oom(cluster: KubeCluster, namespace: str, kubeflow: Kubeflow) -> None:
    first = await released(cluster, namespace, "oom", 1)
    await asyncio.wait_for(kubeflow.wait_pods(namespace, first, 1), 120)
    await kubeflow.oom(namespace, first)
    await until_state(cluster, namespace, "oom", "failed", settled=True)


async def cancel(cluster: KubeCluster, namespace: str, kubeflow: Kubeflow, versions: Versions) -> None:
    first = await released(cluster, namespace, "cancel", 1)
    await asyncio.wait_for(kubeflow.wait_pods(namespace, first, 1), 120)
    cluster.kubectl(
        "patch",
        "dispatchjob",
        "cancel",
        f"--namespace={namespace}",
        "--type=merge",
        "-p",
        '{"spec":{"cancel":true}}',
    )
    await until_state(cluster, namespace, "cancel", "cancelled", settled=True)

"""Suspend, resume and retry by a person on the real control plane, through ``kubectl dispatch`` run
as three minted users: the admission webhook stamps who asked, the record store reads the ask from
the DispatchJob's spec, and the history names each person. The supervisor is the core's, over the
real record store, with the memory adapter as the scheduler, so that the test decides how each
submission ends.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import dispatch
from dispatch._constants import ANNOTATION_RETRIED_BY, ANNOTATION_SUSPENDED_BY
from dispatch._controller.store import KubeRecordStore
from dispatch._dispatchjob import job_spec, new_record
from dispatch._kubeclient import new_client
from tests.integration.conftest import USERS_GROUP, WebhookOperator, await_for
from tests.support.builders import SEED_EXAMPLE
from tests.support.kube import KubeCluster, KubectlError

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent


def kubectl_dispatch(cluster: KubeCluster, kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``kubectl dispatch ARGS`` as the user of ``kubeconfig`` (kubectl finds the plugin on PATH)."""
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "KUBECONFIG": str(kubeconfig),
    }
    return subprocess.run(
        [cluster.kubectl_bin, "dispatch", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )


def live(memory: dispatch.MemoryBackend, submission: int) -> str | None:
    for o in memory.objects():
        if o.submission == submission and o.phase is dispatch.Phase.RUNNING:
            return o.id
    return None


def ended(memory: dispatch.MemoryBackend, object_id: str) -> bool:
    return any(o.id == object_id and o.phase is dispatch.Phase.ENDED for o in memory.objects())


def state(cluster: KubeCluster, namespace: str) -> str:
    return str((cluster.get("dispatchjob", "finetune", namespace).get("status") or {}).get("state"))


def moves(record: dispatch.Record) -> list[tuple[str, str, int | None, str]]:
    return [(t.from_.value, t.to.value, t.submission, str(t.actor)) for t in record.history]


async def test_suspend_resume_and_retry_name_the_person(
    crds: KubeCluster, namespace: str, admission: WebhookOperator
) -> None:
    cluster = crds
    users = {name: cluster.mint_user(name, [USERS_GROUP]) for name in ("alice", "bob", "carol", "dan")}
    cluster.kubectl("apply", "-n", namespace, "-f", str(SEED_EXAMPLE), kubeconfig=users["alice"])
    job = f"{namespace}/finetune"
    api = await new_client(str(cluster.kubeconfig))
    store = KubeRecordStore(api, namespaces=[namespace])
    memory = dispatch.MemoryBackend(dispatch.Shape.SLURM, auto_run=True)

    def supervise() -> asyncio.Task[dispatch.Record]:
        return asyncio.create_task(dispatch.Supervisor(memory, store, poll_interval=0.2).run(job))

    def plugin(user: str, *args: str) -> str:
        done = kubectl_dispatch(cluster, users[user], *args, "finetune", "-n", namespace)
        assert done.returncode == 0, done.stderr
        return done.stdout

    async def record() -> dispatch.Record:
        return (await store.get(job)).record

    try:
        body = await store.read(job)
        spec = job_spec(body)
        await store.create(
            new_record(body, spec, dispatch.make_plan(job, spec, memory.capabilities, supervised=True))
        )
        running = supervise()
        first = await await_for("submission 1 running", lambda: live(memory, 1))

        # Bob suspends: submission 1 is stopped, the record says so and names him.
        assert "suspend requested" in plugin("bob", "suspend")
        annotations = cluster.get("dispatchjob", "finetune", namespace)["metadata"]["annotations"]
        assert annotations[ANNOTATION_SUSPENDED_BY] == "human:bob"
        await await_for("submission 1 ended", lambda: ended(memory, first))
        await await_for("suspended", lambda: state(cluster, namespace) == "suspended")
        assert "already suspended" in plugin("carol", "suspend")

        # Carol resumes: submission 2, authorized by her, no budget spent.
        assert "resume requested" in plugin("carol", "resume")
        await await_for("submission 2 running", lambda: live(memory, 2))
        r = await record()
        assert r.submissions[1].authorized_by == dispatch.Actor(kind=dispatch.ActorKind.HUMAN, id="carol")
        assert r.plan.rules[0].firings == 0

        # Submission 2 runs out of memory, which no rule covers: failed, settled.
        memory.env.out_of_memory(live(memory, 2) or "")
        failed = await asyncio.wait_for(running, 60)
        assert failed.state is dispatch.State.FAILED
        assert failed.settled

        # Dan retries: the job reopens under the same record with submission 3.
        assert "retry 1 requested" in plugin("dan", "retry")
        annotations = cluster.get("dispatchjob", "finetune", namespace)["metadata"]["annotations"]
        assert annotations[ANNOTATION_RETRIED_BY] == "human:dan"
        again = supervise()
        third = await await_for("submission 3 running", lambda: live(memory, 3))
        memory.env.complete(third)
        done = await asyncio.wait_for(again, 60)
        assert moves(done) == [
            ("pending", "suspended", 1, "human:bob"),
            ("suspended", "pending", 2, "human:carol"),
            ("pending", "failed", 2, "supervisor:supervisor"),
            ("failed", "pending", 3, "human:dan"),
            ("pending", "succeeded", 3, "supervisor:supervisor"),
        ]
        assert done.retries == 1
        assert done.plan.rules[0].firings == 0
        # Never two submissions at once: the memory scheduler's own count.
        assert memory.peak_released.get(job, 0) == 1

        # A succeeded job is not retried: the plugin says so, and the webhook refuses the patch.
        refused = kubectl_dispatch(cluster, users["dan"], "retry", "finetune", "-n", namespace)
        assert refused.returncode == 1
        assert "is succeeded: only a failed job is retried" in refused.stdout
        with pytest.raises(KubectlError) as info:
            cluster.kubectl(
                "patch",
                "-n",
                namespace,
                "dispatchjob/finetune",
                "--type=merge",
                "-p",
                json.dumps({"spec": {"retry": {"count": 2}}}),
                kubeconfig=users["dan"],
            )
        assert "spec.retry: only a failed job is retried; this one is succeeded" in info.value.stderr
    finally:
        await store.aclose()
        await api.close()

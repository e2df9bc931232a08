"""Two operator processes with leader election and admission webhooks (``--leader-elect
--webhook-port ...``), on the lab: the real control plane, scheduler and Kubeflow training operator.

Every replica runs kopf, so every replica serves the admission webhooks; only the Lease holder
supervises. Each process manages its own webhook configurations (``DISPATCH_WEBHOOK_MANAGED``), so
while both run every DispatchJob write is admitted by *both* (``failurePolicy: Fail``: a write
succeeds only when both answered). Then:

* the leader (A) supervises the seed's job: one PyTorchJob per submission, the seed's history; the
  standby (B) made no record write and created nothing (its own metrics and log say so);
* a job deleted while A leads: A ends its objects, B's deletion handler waits and lets go only
  once A removed the finalizer;
* A is SIGKILLed and its configurations removed (a dead Pod leaves the Service's endpoints); while
  A's Lease is still held (the test renews it on A's behalf, as a paused leader would) B alone
  refuses an unenforceable job, records the actor of a new one, and supervises nothing;
* the renewals stop, B takes the Lease and supervises the job it admitted to success.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from typing import Any

import pytest

from dispatch._kubeclient import request
from tests.integration.conftest import (
    OperatorProcess,
    ReleaseMonitor,
    apply_claiming,
    await_for,
    free_port,
    get_job,
    history,
    pytorchjobs,
    released_pj,
    users_may_submit,
)
from tests.support.builders import SEED_HISTORY, seed_job
from tests.support.kube import KubeCluster, KubectlError
from tests.support.lab import Kubeflow
from tests.support.operator_probe import holder, lease_path, samples, scrape

pytestmark = pytest.mark.integration


def health(port: int, path: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return int(response.status), json.loads(response.read())
    except urllib.error.HTTPError as error:
        return int(error.code), json.loads(error.read() or b"{}")


def of_job(cluster: KubeCluster, namespace: str, job: str) -> list[dict[str, Any]]:
    return [
        pj
        for pj in pytorchjobs(cluster, namespace)
        if (pj["metadata"].get("labels") or {}).get("dispatch.dev/job") == job
    ]


async def held_by(api: Any, namespace: str, prefix: str) -> bool:
    return (await holder(api, namespace)).startswith(prefix)


async def renew_for(api: Any, namespace: str, identity: str, stop: asyncio.Event) -> None:
    """Keep renewing the Lease on behalf of ``identity`` (a leader that is paused, not dead)."""
    while not stop.is_set():
        with contextlib.suppress(Exception):
            lease = await request(api, "GET", lease_path(namespace))
            if lease["spec"].get("holderIdentity") != identity:
                return  # taken over: the test's check on the holder fails
            lease["spec"]["renewTime"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            await request(api, "PUT", lease_path(namespace), body=lease)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)


async def run_to_success(cluster: KubeCluster, kubeflow: Kubeflow, namespace: str, job: str, n: int) -> None:
    """Submission ``n`` of ``job`` is released; its pods run and succeed; the job shows Succeeded."""
    released = await released_pj(cluster, namespace, n, job=job)
    await asyncio.wait_for(kubeflow.wait_pods(namespace, released["metadata"]["name"], 2), 60)
    await kubeflow.succeed(namespace, released["metadata"]["name"])
    await asyncio.to_thread(
        cluster.kubectl,
        "wait",
        "-n",
        namespace,
        f"dispatchjob/{job}",
        "--for=condition=Succeeded",
        "--timeout=90s",
    )


async def test_two_replicas_both_admit_one_supervises_and_the_standby_takes_over(
    crds: KubeCluster,
    namespace: str,
    operator: Callable[..., OperatorProcess],
    kubeflow: Kubeflow,
    api: Any,
    release_monitor: ReleaseMonitor,
) -> None:
    cluster = crds
    users_may_submit(cluster)
    tag = secrets.token_hex(3)
    managed = {"a": f"a{tag}.dispatch.dev", "b": f"b{tag}.dispatch.dev"}
    metrics = {"a": free_port(), "b": free_port()}
    healthp = {"a": free_port(), "b": free_port()}

    def replica(who: str) -> OperatorProcess:
        return operator(
            "--leader-elect",
            f"--lease-namespace={namespace}",
            f"--webhook-port={free_port()}",
            f"--metrics-port={metrics[who]}",
            f"--health-port={healthp[who]}",
            env={
                "DISPATCH_WEBHOOK_HOST": "127.0.0.1",
                "DISPATCH_WEBHOOK_MANAGED": managed[who],
                "POD_NAME": f"replica-{who}",
            },
        )

    alice = cluster.mint_user("alice", ["dispatch-users"])
    bob = cluster.mint_user("bob", ["dispatch-users"])
    ghost = asyncio.Event()
    renewing: asyncio.Task[None] | None = None
    try:
        a = replica("a")
        lead = await await_for("A holding the Lease", lambda: holder(api, namespace))
        assert lead.startswith("replica-a_")
        b = replica("b")

        def configured(name: str) -> bool:
            return all(
                cluster.kubectl("get", kind, name, "-o", "name", check=False)
                for kind in ("validatingwebhookconfiguration", "mutatingwebhookconfiguration")
            )

        def ready(who: str) -> bool:
            return health(healthp[who], "/readyz")[0] == 200

        for who in ("a", "b"):
            await await_for(f"{who}'s webhook configurations", partial(configured, managed[who]))
            await await_for(f"{who} ready", partial(ready, who))
        assert health(healthp["a"], "/readyz")[1] == {"status": "ready", "leader": True}
        assert health(healthp["b"], "/readyz")[1] == {"status": "ready", "leader": False}
        assert health(healthp["b"], "/healthz") == (200, {"status": "ok", "leader": False})
        assert await holder(api, namespace) == lead

        # Both serve admission: every write goes through both replicas' webhooks (Fail policy), so
        # an accepted dry run means both answered; a refusal names the rule.
        bad = seed_job(
            "restarts", recovery={"rules": [{"on": ["preempted"], "action": "restart", "budget": 2}]}
        )

        def refusal(kubeconfig: Any = None) -> str | None:
            try:
                cluster.kubectl(
                    "apply", "-n", namespace, "--dry-run=server", "-f", "-", input=bad, kubeconfig=kubeconfig
                )
            except KubectlError as error:
                return error.stderr if "denied the request" in error.stderr else None
            return None

        message = await await_for("the webhooks refusing", refusal)
        assert "rule 0 cannot be enforced: only a scheduler can restart in place" in message
        await asyncio.to_thread(
            cluster.kubectl, "apply", "-n", namespace, "--dry-run=server", "-f", "-", input=seed_job("dry")
        )

        # Alice's job: A supervises it through a preemption to success.
        await apply_claiming(cluster, namespace, "finetune", alice)
        first = await released_pj(cluster, namespace, 1, job="finetune")
        await asyncio.wait_for(kubeflow.wait_pods(namespace, first["metadata"]["name"], 2), 60)
        await kubeflow.preempt(namespace, first["metadata"]["name"])
        await run_to_success(cluster, kubeflow, namespace, "finetune", 2)
        await await_for(
            "settled", lambda: (get_job(cluster, namespace, "finetune").get("status") or {}).get("settled")
        )
        body = get_job(cluster, namespace, "finetune")
        assert history(body) == SEED_HISTORY
        assert body["status"]["submittedBy"] == {"kind": "human", "id": "alice"}
        pjs = of_job(cluster, namespace, "finetune")
        assert sorted(pj["metadata"]["labels"]["dispatch.dev/submission"] for pj in pjs) == ["1", "2"]
        assert release_monitor.max_live.get("finetune", 0) <= 1

        # A deletion while A leads: A ends the objects and lets go; B, running no loop, touches nothing.
        await asyncio.to_thread(
            cluster.kubectl, "apply", "-n", namespace, "-f", "-", input=seed_job("doomed"), kubeconfig=alice
        )
        doomed = await released_pj(cluster, namespace, 1, job="doomed")
        await asyncio.to_thread(
            cluster.kubectl, "delete", "-n", namespace, "dispatchjob/doomed", "--timeout=90s"
        )
        left = [
            pj
            for pj in of_job(cluster, namespace, "doomed")
            if not pj["metadata"].get("deletionTimestamp")
            and not (pj["metadata"].get("annotations") or {}).get("dispatch.dev/ended")
        ]
        assert not left, f"the finalizer went before {doomed['metadata']['name']} ended"

        # Only A wrote records and created PyTorchJobs; B's metrics (its API requests) show none.
        seen = {
            who: await asyncio.to_thread(scrape, f"http://127.0.0.1:{metrics[who]}/metrics")
            for who in metrics
        }
        assert (
            samples(seen["a"], "dispatch_api_requests_total", verb="update", resource="dispatchjobs/status")
            >= 4
        )
        assert (
            samples(
                seen["a"], "dispatch_api_requests_total", verb="create", resource="pytorchjobs", code="201"
            )
            == 3
        )
        assert samples(seen["a"], "dispatch_jobs", state="succeeded") == 1
        assert samples(seen["b"], "dispatch_api_requests_total", resource="dispatchjobs/status") == 0
        # The finalizer is the loop's: the mutating webhook (either replica's) gave it to both jobs
        # on creation, A removed it from doomed, B's loop never touched one.
        assert samples(seen["a"], "dispatch_api_requests_total", verb="patch", resource="dispatchjobs") >= 1
        assert samples(seen["b"], "dispatch_api_requests_total", verb="patch", resource="dispatchjobs") == 0
        for verb in ("create", "patch", "update", "delete"):
            assert samples(seen["b"], "dispatch_api_requests_total", verb=verb, resource="pytorchjobs") == 0
        assert samples(seen["b"], "dispatch_api_requests_total", resource="leases") > 0
        assert "planned" not in b.log()

        # A dies; its Lease stays held (renewed on its behalf: a paused leader). A's webhook
        # configurations go, as a dead Pod leaves the Service; B alone serves admission.
        a.kill()
        renewing = asyncio.create_task(renew_for(api, namespace, lead, ghost))
        for kind in ("validatingwebhookconfiguration", "mutatingwebhookconfiguration"):
            await asyncio.to_thread(cluster.kubectl, "delete", kind, managed["a"], "--ignore-not-found")
        message = await await_for("B refusing", lambda: refusal(bob))
        assert "rule 0 cannot be enforced: only a scheduler can restart in place" in message
        await apply_claiming(cluster, namespace, "standby", bob)
        assert get_job(cluster, namespace, "standby")["metadata"]["annotations"][
            "dispatch.dev/submitted-by"
        ] == ("human:bob")
        await asyncio.sleep(3)  # several poll intervals: a supervising B would have written by now
        assert await holder(api, namespace) == lead, "B took over while A's Lease was renewed"
        assert health(healthp["b"], "/readyz") == (200, {"status": "ready", "leader": False})
        assert not (get_job(cluster, namespace, "standby").get("status") or {}).get("plan")
        assert not of_job(cluster, namespace, "standby")

        # The renewals stop: B takes the Lease over and supervises what it admitted.
        ghost.set()
        await renewing
        renewing = None
        await await_for("B holding the Lease", lambda: held_by(api, namespace, "replica-b_"))
        await run_to_success(cluster, kubeflow, namespace, "standby", 1)
        body = get_job(cluster, namespace, "standby")
        assert body["status"]["submittedBy"] == {"kind": "human", "id": "bob"}
        assert [s["n"] for s in body["status"]["submissions"]] == [1]
        assert len(of_job(cluster, namespace, "standby")) == 1
        # The settled job was not touched again: still one PyTorchJob per submission.
        assert len(of_job(cluster, namespace, "finetune")) == 2
        assert health(healthp["b"], "/readyz") == (200, {"status": "ready", "leader": True})
        assert release_monitor.max_live.get("standby", 0) <= 1
        assert b.running
    finally:
        ghost.set()
        if renewing is not None:
            with contextlib.suppress(Exception):
                await renewing
        for name in managed.values():
            for kind in ("validatingwebhookconfiguration", "mutatingwebhookconfiguration"):
                cluster.kubectl("delete", kind, name, "--ignore-not-found", check=False)

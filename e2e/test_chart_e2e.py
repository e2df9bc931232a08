"""The chart, end to end: helm install, the operator under the chart's identity, upgrade, uninstall,
and two operators with leader election.

The operator runs as a process (``python -m dispatch._controller``) with a kubeconfig acting as exactly
the ServiceAccount the chart creates, so whatever it needs beyond the chart's RBAC fails here.
Kubeflow's training operator is the real one (the lab's, tests/support/lab.py).
Durations are printed (and recorded as junit properties), never asserted.
"""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatch._constants import CRD_NAME, LEASE_NAME
from dispatch._kubeclient import Client, KubeError, request
from e2e.support import CHART, REPO, Release, assert_no_forbidden, kubectl_json, kubectl_wait, start_operator
from tests.integration.conftest import (
    ReleaseMonitor,
    apply,
    await_for,
    condition,
    dispatch_job,
    get_job,
    pytorchjobs,
    released_pj,
)
from tests.support.kube import KubeCluster, KubectlError
from tests.support.lab import Kubeflow

pytestmark = pytest.mark.e2e


def assert_one_object_per_submission(
    cluster: KubeCluster, namespace: str, job: str, submissions: int
) -> None:
    pjs = [
        p
        for p in pytorchjobs(cluster, namespace)
        if (p["metadata"].get("labels") or {}).get("dispatch.dev/job") == job
    ]
    by_submission: dict[str, list[str]] = {}
    for pj in pjs:
        n = (pj["metadata"].get("labels") or {}).get("dispatch.dev/submission", "?")
        by_submission.setdefault(n, []).append(pj["metadata"]["name"])
    assert sorted(by_submission) == [str(n) for n in range(1, submissions + 1)], by_submission
    assert all(len(names) == 1 for names in by_submission.values()), f"duplicate PyTorchJob: {by_submission}"


# ---- install, and the operator's identity is enough and no more ------------------------------------


async def test_install_and_a_full_lifecycle_under_the_chart_identity(
    release: Callable[..., Release],
    namespace: str,
    kubeflow: Kubeflow,
    release_monitor: ReleaseMonitor,
    tmp_path: Path,
) -> None:
    rel = release(f"watchNamespaces={{{namespace}}}")
    cluster = rel.cluster
    crd = kubectl_json(cluster, "get", "crd", CRD_NAME)
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert crd["metadata"]["annotations"]["meta.helm.sh/release-name"] == rel.name
    cluster.wait_established(CRD_NAME)
    kinds = {(d["kind"], d["metadata"]["name"]) for d in rel.manifest()}
    assert ("ServiceAccount", rel.name) in kinds
    assert ("Role", rel.name) in kinds  # the job rules, in the watched namespace only
    assert ("ClusterRole", rel.name) not in kinds
    # The examples are apply-able as they are (the API server validates them against the CRD).
    for example in ("kubeflow-dispatchjob.yaml", "slurm-dispatchjob.yaml"):
        cluster.kubectl(
            "apply", "--dry-run=server", f"--namespace={namespace}", "-f", str(REPO / "examples" / example)
        )

    op = start_operator(rel, namespace, tmp_path)
    await asyncio.to_thread(apply, cluster, namespace, dispatch_job("finetune"))
    first = await released_pj(cluster, namespace, 1, job="finetune", within=120)
    name1 = first["metadata"]["name"]
    await asyncio.wait_for(kubeflow.wait_pods(namespace, name1, 2), 60)
    await kubeflow.preempt(namespace, name1)
    second = await released_pj(cluster, namespace, 2, job="finetune", within=120)
    name2 = second["metadata"]["name"]
    await asyncio.wait_for(kubeflow.wait_pods(namespace, name2, 2), 60)
    await kubeflow.succeed(namespace, name2)
    await kubectl_wait(cluster, namespace, "finetune", "Succeeded")
    await await_for("settled", lambda: get_job(cluster, namespace, "finetune")["status"].get("settled"))
    body = await asyncio.to_thread(get_job, cluster, namespace, "finetune")
    assert body["status"]["state"] == "succeeded"
    assert condition(body, "Ready")["status"] == "True"  # type: ignore[index]
    assert [s["n"] for s in body["status"]["submissions"]] == [1, 2]
    assert_one_object_per_submission(cluster, namespace, "finetune", 2)
    assert release_monitor.max_live.get("finetune", 0) == 1
    # Cancel, as a user would, and the operator (still under the chart's identity) ends the job.
    await asyncio.to_thread(apply, cluster, namespace, dispatch_job("cancelled"))
    await released_pj(cluster, namespace, 1, job="cancelled", within=120)
    cluster.kubectl(
        "patch",
        "dispatchjob",
        "cancelled",
        f"--namespace={namespace}",
        "--type=merge",
        "-p",
        '{"spec":{"cancel":true}}',
    )
    await kubectl_wait(cluster, namespace, "cancelled", "Failed")
    cancelled = await asyncio.to_thread(get_job, cluster, namespace, "cancelled")
    assert cancelled["status"]["state"] == "cancelled"
    op.stop()
    assert_no_forbidden(op)


def test_the_operator_identity_is_refused_outside_its_job(
    release: Callable[..., Release], namespace: str
) -> None:
    rel = release(f"watchNamespaces={{{namespace}}}", "leaderElection.enabled=true")
    other = rel.namespace  # a namespace the operator does not watch (its own)
    cluster = rel.cluster
    cluster.apply(
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "private", "namespace": namespace}}
    )
    sa = rel.sa_kubeconfig()
    # Real requests with the operator's credentials: Secrets anywhere are forbidden.
    for ns in (namespace, other, "default"):
        with pytest.raises(KubectlError, match=r"(?i)forbidden"):
            cluster.kubectl("get", "secrets", f"--namespace={ns}", kubeconfig=sa)
    with pytest.raises(KubectlError, match=r"(?i)forbidden"):
        cluster.kubectl("get", "secret", "private", f"--namespace={namespace}", kubeconfig=sa)
    with pytest.raises(KubectlError, match=r"(?i)forbidden"):
        cluster.kubectl("get", "dispatchjobs", "--all-namespaces", kubeconfig=sa)
    # What it may do, and where.
    assert rel.can_i("watch", "dispatchjobs.dispatch.dev", namespace)
    assert rel.can_i("update", "dispatchjobs.dispatch.dev/status", namespace)
    assert rel.can_i("create", "pytorchjobs.kubeflow.org", namespace)
    assert rel.can_i("delete", "pods", namespace)
    assert rel.can_i("deletecollection", "pods", namespace)
    assert rel.can_i("update", "leases.coordination.k8s.io", other)
    # A settled job whose time to live has passed is deleted by the operator.
    assert rel.can_i("delete", "dispatchjobs.dispatch.dev", namespace)
    # ...and what it may not.
    refused = [
        ("get", "secrets", namespace),
        ("list", "configmaps", namespace),
        ("create", "dispatchjobs.dispatch.dev", namespace),
        ("update", "dispatchjobs.dispatch.dev", namespace),
        ("create", "pods", namespace),
        ("patch", "pods", namespace),
        ("create", "pytorchjobs.kubeflow.org", other),
        ("list", "dispatchjobs.dispatch.dev", other),
        ("update", "dispatchjobs.dispatch.dev/status", other),
        ("update", "leases.coordination.k8s.io", namespace),
        ("delete", "leases.coordination.k8s.io", other),
        ("create", "roles.rbac.authorization.k8s.io", namespace),
        ("update", "customresourcedefinitions.apiextensions.k8s.io", None),
        ("create", "kopfpeerings.kopf.dev", namespace),
    ]
    allowed = [r for r in refused if rel.can_i(r[0], r[1], r[2])]
    assert not allowed, f"the operator may do more than its job: {allowed}"


def test_cluster_wide_install_grants_the_job_rules_in_every_namespace(
    release: Callable[..., Release], namespace: str
) -> None:
    rel = release()
    assert rel.can_i("list", "dispatchjobs.dispatch.dev", None, "--all-namespaces")
    assert rel.can_i("create", "pytorchjobs.kubeflow.org", namespace)
    assert rel.can_i("create", "events.events.k8s.io", namespace)
    assert not rel.can_i("get", "secrets", namespace)
    assert not rel.can_i("list", "namespaces", None)  # kopf needs them only for a namespace list
    assert not rel.can_i("create", "leases.coordination.k8s.io", rel.namespace)  # no leader election
    names = {d["metadata"]["name"] for d in rel.manifest() if d["kind"] == "ClusterRole"}
    assert {rel.name, f"{rel.name}-kopf", f"{rel.name}-viewer", f"{rel.name}-editor"} <= names


def test_editor_and_viewer_roles(release: Callable[..., Release], namespace: str) -> None:
    """The aggregated roles, bound directly (a bare API server runs no aggregation controller)."""
    rel = release()
    cluster = rel.cluster
    for role, user in (("editor", "ed"), ("viewer", "vi")):
        cluster.apply(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": f"dispatch-{role}", "namespace": namespace},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": f"{rel.name}-{role}",
                },
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
            }
        )

    def can(user: str, verb: str, resource: str) -> bool:
        resource, _, sub = resource.partition("/")
        subresource = [f"--subresource={sub}"] if sub else []
        out = cluster.kubectl(
            "auth",
            "can-i",
            verb,
            resource,
            *subresource,
            f"--namespace={namespace}",
            f"--as={user}",
            check=False,
        )
        return out.strip() == "yes"

    assert can("ed", "create", "dispatchjobs.dispatch.dev")
    assert can("ed", "patch", "dispatchjobs.dispatch.dev")
    assert not can("ed", "update", "dispatchjobs.dispatch.dev/status")
    assert can("vi", "list", "dispatchjobs.dispatch.dev")
    assert not can("vi", "patch", "dispatchjobs.dispatch.dev")
    crs = {d["metadata"]["name"]: d for d in rel.manifest() if d["kind"] == "ClusterRole"}
    assert (
        crs[f"{rel.name}-viewer"]["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"]
        == "true"
    )
    assert (
        crs[f"{rel.name}-editor"]["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"]
        == "true"
    )


# ---- upgrade and uninstall ---------------------------------------------------------------------------


def test_upgrade_applies_a_changed_crd_and_uninstall_keeps_crd_and_jobs(
    release: Callable[..., Release], namespace: str, tmp_path: Path
) -> None:
    rel = release(f"watchNamespaces={{{namespace}}}")
    cluster = rel.cluster
    apply(cluster, namespace, dispatch_job("kept"))
    # A new chart version whose CRD has one more printer column.
    chart = tmp_path / "dispatch-operator"
    shutil.copytree(CHART, chart)
    crds = chart / "templates" / "crds.yaml"
    text = crds.read_text()
    column = "    - name: Age\n      type: date\n      jsonPath: .metadata.creationTimestamp\n"
    assert column in text
    crds.write_text(
        text.replace(
            column,
            column
            + "    - name: Cancel\n      type: boolean\n      jsonPath: .spec.cancel\n      priority: 1\n",
        )
    )
    rel.upgrade(chart)
    columns = kubectl_json(cluster, "get", "crd", CRD_NAME)["spec"]["versions"][0]["additionalPrinterColumns"]
    assert "Cancel" in [c["name"] for c in columns]
    # ...and the chart's own CRD again (a downgrade of the column) is applied too.
    rel.upgrade(CHART)
    columns = kubectl_json(cluster, "get", "crd", CRD_NAME)["spec"]["versions"][0]["additionalPrinterColumns"]
    assert "Cancel" not in [c["name"] for c in columns]

    rel.uninstall()
    assert (
        cluster.kubectl("get", "crd", CRD_NAME, "-o", "name").strip()
        == f"customresourcedefinition.apiextensions.k8s.io/{CRD_NAME}"
    )
    assert get_job(cluster, namespace, "kept")["metadata"]["name"] == "kept"
    left = cluster.kubectl("get", "clusterroles", "-o", "name").split()
    assert f"clusterrole.rbac.authorization.k8s.io/{rel.name}" not in left
    assert not cluster.kubectl(
        "get",
        "serviceaccounts",
        f"--namespace={rel.namespace}",
        "-o",
        "name",
        "--field-selector",
        f"metadata.name={rel.name}",
    ).strip()


# ---- two operators, leader election ---------------------------------------------------------------------


async def _holder(api: Client, namespace: str) -> str:
    try:
        lease = await request(
            api, "GET", f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{LEASE_NAME}"
        )
    except KubeError as e:
        if e.status == 404:
            return ""
        raise
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


async def _until_holder(api: Client, namespace: str, accept: Callable[[str], bool]) -> str:
    async with asyncio.timeout(120):
        while True:
            holder = await _holder(api, namespace)
            if accept(holder):
                return holder
            await asyncio.sleep(0.05)


async def test_two_operators_leader_killed_standby_takes_over_without_duplicates(
    release: Callable[..., Release],
    namespace: str,
    api: Any,
    kubeflow: Kubeflow,
    release_monitor: ReleaseMonitor,
    tmp_path: Path,
    record_property: Callable[[str, object], None],
) -> None:
    rel = release(f"watchNamespaces={{{namespace}}}", "leaderElection.enabled=true")
    cluster = rel.cluster
    args = ("--leader-elect", f"--lease-namespace={rel.namespace}", f"--lease-name={LEASE_NAME}")
    ops = {
        pod: start_operator(rel, namespace, tmp_path, *args, env={"POD_NAME": pod}, tag=f"-{pod}")
        for pod in ("op-a", "op-b")
    }
    first = await _until_holder(api, rel.namespace, bool)
    leader = first.split("_", 1)[0]
    standby = next(p for p in ops if p != leader)

    await asyncio.to_thread(apply, cluster, namespace, dispatch_job("ha"))
    pj1 = await released_pj(cluster, namespace, 1, job="ha", within=120)
    name1 = pj1["metadata"]["name"]
    await asyncio.wait_for(kubeflow.wait_pods(namespace, name1, 2), 60)

    # SIGKILL the leader: no release, the standby waits for the Lease to expire.
    killed_at = time.monotonic()
    ops[leader].kill()
    await kubeflow.preempt(namespace, name1)
    second = await _until_holder(api, rel.namespace, lambda h: h.startswith(f"{standby}_"))
    lease_takeover = time.monotonic() - killed_at
    pj2 = await released_pj(cluster, namespace, 2, job="ha", within=120)
    resumed = time.monotonic() - killed_at
    name2 = pj2["metadata"]["name"]

    # The killed one comes back as a standby; a clean stop of the new leader hands over at once.
    ops[leader] = start_operator(
        rel, namespace, tmp_path, *args, env={"POD_NAME": leader}, tag=f"-{leader}-2"
    )
    await asyncio.sleep(3)  # let it start polling the Lease (not a timing assertion)
    stopped_at = time.monotonic()
    proc = ops[standby].proc
    assert proc is not None
    os.kill(proc.pid, signal.SIGTERM)
    third = await _until_holder(api, rel.namespace, lambda h: h.startswith(f"{leader}_"))
    release_takeover = time.monotonic() - stopped_at
    assert ops[standby].wait_exit(60) == 0

    await asyncio.wait_for(kubeflow.wait_pods(namespace, name2, 2), 60)
    await kubeflow.succeed(namespace, name2)
    await kubectl_wait(cluster, namespace, "ha", "Succeeded")
    body = await asyncio.to_thread(get_job, cluster, namespace, "ha")
    assert [s["n"] for s in body["status"]["submissions"]] == [1, 2]
    assert_one_object_per_submission(cluster, namespace, "ha", 2)
    assert release_monitor.max_live.get("ha", 0) == 1
    assert len({first, second, third}) == 3
    for op in ops.values():
        op.stop()
    assert_no_forbidden(*ops.values())

    figures = {
        "lease_takeover_after_sigkill_s": round(lease_takeover, 2),
        "supervision_resumed_after_sigkill_s": round(resumed, 2),
        "lease_takeover_after_sigterm_s": round(release_takeover, 2),
    }
    for key, value in figures.items():
        record_property(key, value)
    print(
        f"\nleader election takeover (lease 15 s, renew deadline 10 s, retry 2 s): {yaml.safe_dump(figures)}"
    )


# ---- the webhook's certificate across upgrades -------------------------------------------------------


def test_webhook_certificate_is_kept_by_an_upgrade_and_renewed_when_due(
    release: Callable[..., Release], namespace: str
) -> None:
    """helm upgrade keeps the generated certificate and caBundle; the first upgrade after the
    Secret's renew-after makes new ones, with a caBundle that still trusts the old CA (the Pod
    serves the old certificate until the kubelet updates the mount)."""
    # failurePolicy Ignore and only this namespace: the lab's API server cannot reach the Service.
    rel = release(f"watchNamespaces={{{namespace}}}", "webhook.enabled=true", "webhook.failurePolicy=Ignore")
    cluster = rel.cluster
    secret_name = f"{rel.name}-webhook-tls"

    def state() -> tuple[dict[str, str], str, str]:
        secret = kubectl_json(cluster, "get", "secret", secret_name, f"--namespace={rel.namespace}")
        config = kubectl_json(cluster, "get", "validatingwebhookconfiguration", rel.name)
        bundle = config["webhooks"][0]["clientConfig"]["caBundle"]
        return secret["data"], bundle, secret["metadata"]["annotations"]["dispatch.dev/renew-after"]

    data, bundle, renew_after = state()
    assert int(renew_after) > time.time() + 200 * 86400, "two thirds of the default 365 days"
    rel.upgrade()
    assert state() == (data, bundle, renew_after), "an upgrade changed the certificate"
    cluster.kubectl(
        "annotate", "secret", secret_name, f"--namespace={rel.namespace}",
        "dispatch.dev/renew-after=1", "--overwrite",
    )  # fmt: skip
    rel.upgrade()
    renewed, renewed_bundle, renewed_after = state()
    assert renewed["tls.crt"] != data["tls.crt"]
    assert renewed["ca.crt"] != data["ca.crt"]
    assert int(renewed_after) > time.time()
    pems = base64.b64decode(renewed_bundle).decode()
    assert base64.b64decode(renewed["ca.crt"]).decode().strip() in pems
    assert base64.b64decode(data["ca.crt"]).decode().strip() in pems, "the old CA is still trusted"
    rel.upgrade()
    assert state()[0] == renewed, "the renewed certificate is kept by the next upgrade"

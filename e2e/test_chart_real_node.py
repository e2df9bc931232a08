"""The chart's operator as a real pod: the image `make image` built, imported into the real node's
containerd (tests.support.node), the chart's Deployment placed there by its ``nodeSelector`` and
``tolerations`` values, started by a real kubelet from the pod spec the chart rendered.

The lab here is the e2e tier's with two changes a pod-based operator needs (its own lab, so the
session's keeps its settings): kube-apiserver resolves a Service to its endpoints
(``--enable-aggregator-routing``: the admission webhooks are reached through the chart's webhook
Service with no kube-proxy), and its ServiceAccount admission mounts the chart's ServiceAccount
token into the pod; the real node routes the ``kubernetes`` Service's address to the API server
(``RealNode(api_for_pods=True)``), so the operator reads its in-cluster configuration as in any
cluster. Nothing stands in for the kubelet: probes, the security context, the mounts and the
grace period are the kubelet's and runc's.

Durations are printed, never asserted.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.podman import image_ref, podman, require_image
from e2e.support import CHART, Helm, kubectl_json, short_name
from tests.integration.conftest import USERS_GROUP, await_for, get_job, users_may_submit
from tests.support.builders import lab_manifest
from tests.support.helm import helm_binary
from tests.support.kube import KubeCluster, KubectlError, lab_cluster
from tests.support.node import NodeError, RealNode

pytestmark = [pytest.mark.e2e, pytest.mark.node]

APISERVER_ARGS = (
    # The webhook configurations name a Service: reached through its endpoints, not a ClusterIP.
    "--enable-aggregator-routing=true",
    # `kubectl logs` reaches the node by its address (nothing resolves the node's name).
    "--kubelet-preferred-address-types=InternalIP",
)


@pytest.fixture(scope="module")
def node_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KubeCluster, RealNode]]:
    """A lab of this module's own (see the module docstring) with the real node joined to it."""
    workdir = tmp_path_factory.mktemp("pod-lab")
    with lab_cluster(
        workdir, nodes=1, training_operator=False, apiserver_args=APISERVER_ARGS, service_accounts=True
    ) as cluster:
        assert cluster.lab is not None
        node = RealNode(cluster.lab, workdir / "node", api_for_pods=True)
        try:
            node.start()
        except NodeError as e:
            node.stop()
            pytest.fail(str(e), pytrace=False)
        try:
            yield cluster, node
        finally:
            node.stop()


@pytest.fixture(scope="module")
def image_on_node(node_lab: tuple[KubeCluster, RealNode], tmp_path_factory: pytest.TempPathFactory) -> str:
    """The operator image, from podman's store into the real node's containerd (no registry)."""
    ref = image_ref()
    require_image(ref)
    archive = tmp_path_factory.mktemp("image") / "operator.tar"
    podman("save", "--format=docker-archive", f"--output={archive}", ref, timeout=300)
    try:
        node_lab[1].import_image(archive)
    finally:
        archive.unlink(missing_ok=True)
    return ref


def chart_values(image: str, node: RealNode, namespace: str) -> dict[str, Any]:
    """The release's values: the image, the real node's placement, leader election, the webhooks
    (the chart's own certificate), the `job` backend for the jobs of ``namespace``."""
    repository, _, tag = image.rpartition(":")
    placement = node.placement()
    return {
        "image": {"repository": repository, "tag": tag},
        "nodeSelector": placement["nodeSelector"],
        "tolerations": placement["tolerations"],
        "leaderElection": {"enabled": True},
        "webhook": {"enabled": True, "failurePolicy": "Fail"},
        "watchNamespaces": [namespace],
        "backends": ["job"],
    }


def operator_pod(cluster: KubeCluster, namespace: str, release: str) -> dict[str, Any]:
    pods = kubectl_json(
        cluster, "get", "pods", f"--namespace={namespace}", f"-l=app.kubernetes.io/instance={release}"
    )["items"]
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    pod: dict[str, Any] = pods[0]
    return pod


def ready(pod: dict[str, Any]) -> bool:
    return any(
        c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions") or ()
    )


def host_process(container_id: str) -> Path:
    """/proc/PID of the container's process on this host: the one in the container's cgroup
    (the kubelet names the leaf after the container's id)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cgroups = (proc / "cgroup").read_text()
        except OSError:
            continue
        if any(line.endswith("/" + container_id) for line in cgroups.splitlines()):
            return proc
    raise AssertionError(f"no process in the cgroup of container {container_id}")


def status_fields(proc: Path) -> dict[str, str]:
    fields = (line.split(":", 1) for line in (proc / "status").read_text().splitlines())
    return {key: value.strip() for key, value in fields}


def root_mount_options(proc: Path) -> set[str]:
    for line in (proc / "mountinfo").read_text().splitlines():
        parts = line.split()
        if parts[4] == "/":
            return set(parts[5].split(","))
    raise AssertionError(f"no root mount in {proc}/mountinfo")


@pytest.mark.timeout(600)  # the lab, the node and the image's import come first
async def test_the_charts_operator_runs_as_a_pod_on_a_real_kubelet(
    node_lab: tuple[KubeCluster, RealNode], image_on_node: str, tmp_path: Path
) -> None:
    """The chart installed as a user installs it: the Deployment's pod starts from the image on
    the real node and becomes Ready by its probes, holds the Lease, runs under the rendered
    restricted security context; its webhooks, reached through the Service, refuse a job that
    cannot be enforced and record who applied a good one, which it then runs to success on the
    same node."""
    cluster, node = node_lab
    binary = helm_binary()
    if binary is None:
        pytest.fail("helm not found: run `make bins` or set DISPATCH_HELM", pytrace=False)
    helm = Helm(binary=binary, cluster=cluster, home=tmp_path / "helm")
    name, jobs = short_name("dso"), short_name("jobs")
    for ns in (name, jobs):
        cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(chart_values(image_on_node, node, jobs)))
    started = time.monotonic()
    helm.run(
        "install",
        name,
        str(CHART),
        f"--namespace={name}",
        f"--values={values}",
        f"--set=fullnameOverride={name}",
    )
    rendered = {
        (d["kind"], d["metadata"]["name"]): d
        for d in yaml.safe_load_all(helm.run("get", "manifest", name, f"--namespace={name}").stdout)
        if d
    }

    def ready_pod() -> dict[str, Any] | None:
        pod = operator_pod(cluster, name, name)
        return pod if ready(pod) else None

    pod = await await_for("the operator pod Ready", ready_pod, within=180)
    to_ready = time.monotonic() - started
    assert pod["spec"]["nodeName"] == node.name
    (container,) = pod["status"]["containerStatuses"]
    assert (container["image"], container["restartCount"], container["ready"]) == (
        image_on_node,
        0,
        True,
    ), container
    assert "running" in container["state"], container

    # The security context the kubelet was given is the one the chart rendered, and runc applied it.
    template = rendered[("Deployment", name)]["spec"]["template"]["spec"]
    assert pod["spec"]["securityContext"] == template["securityContext"]
    (spec,) = pod["spec"]["containers"]
    assert spec["securityContext"] == template["containers"][0]["securityContext"]
    proc = host_process(container["containerID"].rpartition("//")[2])
    status = status_fields(proc)
    assert status["Uid"].split() == ["65532"] * 4, status["Uid"]
    assert status["Gid"].split() == ["65532"] * 4, status["Gid"]
    assert status["NoNewPrivs"] == "1"
    assert int(status["CapEff"], 16) == 0, status["CapEff"]
    assert status["Seccomp"] == "2", "a seccomp filter (RuntimeDefault)"
    assert "ro" in root_mount_options(proc)

    # Leader election: the pod holds the chart's Lease.
    def holder() -> str:
        lease = kubectl_json(cluster, "get", "lease", "dispatch-operator", f"--namespace={name}")
        return str(lease["spec"].get("holderIdentity") or "")

    held_by = await await_for("the Lease held", holder, within=60)
    assert held_by.startswith(pod["metadata"]["name"] + "_"), held_by

    # The webhooks are configured through the Service, and the Service's endpoint is this pod.
    for kind in ("validatingwebhookconfiguration", "mutatingwebhookconfiguration"):
        for hook in kubectl_json(cluster, "get", kind, name)["webhooks"]:
            assert "url" not in hook["clientConfig"]
            assert hook["clientConfig"]["service"]["name"] == f"{name}-webhook"
    endpoints = kubectl_json(cluster, "get", "endpoints", f"{name}-webhook", f"--namespace={name}")
    addresses = [a["ip"] for s in endpoints.get("subsets") or () for a in s.get("addresses") or ()]
    assert addresses == [pod["status"]["podIP"]]

    # With ServiceAccount admission a pod needs its ServiceAccount: the job's pods use `default`.
    await await_for(
        "the default ServiceAccount of the jobs' namespace",
        lambda: cluster.kubectl("get", "serviceaccount", "default", f"--namespace={jobs}", check=False),
    )
    users_may_submit(cluster)
    alice = cluster.mint_user("alice", [USERS_GROUP])
    placement = node.placement()
    options = {
        "image": node.image,
        "resources": {"cpu": "100m", "memory": "128Mi"},
        "nodeSelector": placement["nodeSelector"],
        "tolerations": placement["tolerations"],
    }
    unenforceable = [{"on": ["preempted"], "action": "restart", "budget": 2}]
    bad = lab_manifest("job", "restarts", unenforceable, options=options, command=["python3", "-c", "pass"])
    with pytest.raises(KubectlError) as refused:
        cluster.kubectl("apply", f"--namespace={jobs}", "-f", "-", input=bad, kubeconfig=alice)
    assert "denied the request" in refused.value.stderr
    assert "cannot be enforced" in refused.value.stderr

    good = yaml.safe_load(
        lab_manifest("job", "hello", [], options=options, command=["python3", "-c", "print('hello')"])
    )
    good["metadata"]["annotations"] = {"dispatch.dev/submitted-by": "human:mallory"}
    await asyncio.to_thread(
        cluster.kubectl,
        "apply",
        f"--namespace={jobs}",
        "-f",
        "-",
        input=yaml.safe_dump(good),
        kubeconfig=alice,
    )
    body = await await_for(
        "hello settled",
        lambda: (b := get_job(cluster, jobs, "hello")).get("status", {}).get("settled") and b,
        within=120,
    )
    assert body["status"]["state"] == "succeeded", body["status"]
    assert body["status"]["submittedBy"] == {"kind": "human", "id": "alice"}, "the mutating webhook"
    pods = kubectl_json(cluster, "get", "pods", f"--namespace={jobs}", "-l=dispatch.dev/job=hello")["items"]
    assert {p["spec"]["nodeName"] for p in pods} == {node.name}

    after = operator_pod(cluster, name, name)
    assert after["status"]["containerStatuses"][0]["restartCount"] == 0, "no probe failed"
    helm.run("uninstall", name, f"--namespace={name}", "--wait", "--timeout=120s")
    print(f"\nchart pod on the real node: Ready {to_ready:.1f} s after helm install; {json.dumps(addresses)}")

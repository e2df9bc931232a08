"""The operator image (`make image`), run by podman as the chart's Deployment says, on the lab.

Every container here is derived from the Deployment the chart installed (read back from the API
server) by :func:`e2e.podman.container_from_deployment`: image, args, env, probes, security
context, volumes, resources, grace period; so the chart and the image cannot drift apart. What
stands in for the kubelet is said there (the host network; the ServiceAccount's credentials) and,
for the admission webhooks, here: the webhook configurations the chart installed point at its
Service, which no kube-proxy routes in the lab, so the test points them at the container's port
on 127.0.0.1 instead (the certificate, from a Secret the chart mounts, names both).

Durations are printed, never asserted.
"""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatch import __version__
from dispatch._controller.webhook import generate_certificates
from e2e.podman import (
    LIMITS,
    Container,
    Identity,
    UnsupportedPodSpec,
    container_from_deployment,
    image_ref,
    podman,
    require_image,
)
from e2e.support import Release, kubectl_json
from tests.integration.conftest import (
    USERS_GROUP,
    ReleaseMonitor,
    await_for,
    dispatch_job,
    free_port,
    get_job,
    history,
    pytorchjobs,
    users_may_submit,
)
from tests.support.builders import SEED_HISTORY
from tests.support.kube import KubeCluster, KubectlError
from tests.support.lab import Kubeflow

pytestmark = pytest.mark.e2e

FORBIDDEN = ("403 Forbidden", " forbidden", "Forbidden:")


@pytest.fixture(scope="module")
def image() -> str:
    ref = image_ref()
    require_image(ref)
    return ref


@pytest.fixture
def containers() -> Iterator[list[Container]]:
    made: list[Container] = []
    yield made
    for c in made:
        c.remove()


def run_image(image: str, *args: str, entrypoint: str | None = None) -> tuple[int, str]:
    """One short-lived run with the chart's hardening, no volumes: (exit code, output)."""
    argv = ["run", "--rm", "--network=host", *LIMITS, "--read-only", "--read-only-tmpfs=false"]
    argv += ["--cap-drop=ALL", "--security-opt=no-new-privileges", "--pull=never"]
    if entrypoint is not None:
        argv.append(f"--entrypoint={entrypoint}")
    proc = podman(*argv, image, *args, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def test_the_image_is_what_the_dockerfile_promises(image: str) -> None:
    config = require_image(image)
    assert config["Config"]["User"] == "65532:65532"
    assert config["Config"]["Entrypoint"] == ["dispatch-operator"]
    code, out = run_image(image, "--help")
    assert code == 0, out
    assert out.startswith("usage: dispatch-operator"), out
    code, out = run_image(image, "--version")
    assert (code, out.strip()) == (0, f"dispatch-operator {__version__}")
    # No shell, no package manager, no compiler, no installer: nothing to build or install with.
    for tool in ("/bin/sh", "/bin/bash", "/usr/bin/apt-get", "/usr/bin/dpkg", "/usr/bin/gcc"):
        code, out = run_image(image, "--version", entrypoint=tool)
        assert code != 0, f"{tool} exists in the image: {out}"
    probe = (
        "import importlib.util as u, os, sys; "
        "print([m for m in ('pip', 'setuptools', 'ensurepip', 'wheel', 'build') if u.find_spec(m)]); "
        "print(os.getuid(), os.getgid())"
    )
    code, out = run_image(image, "-c", probe, entrypoint="/opt/dispatch/bin/python")
    assert (code, out.split("\n")[:2]) == (0, ["[]", "65532 65532"]), out
    # Read-only root: the operator writes nowhere but the chart's /tmp (an emptyDir).
    code, out = run_image(image, "-c", "open('/opt/dispatch/x', 'w')", entrypoint="/opt/dispatch/bin/python")
    assert code != 0
    assert "Read-only file system" in out, out
    size_mb = round(int(config["Size"]) / 1e6, 1)
    print(f"\nimage {image}: {size_mb} MB")


# ---- the chart's Deployment, run by podman ---------------------------------------------------------


def chart_values(image: str, *extra: str) -> list[str]:
    repository, _, tag = image.rpartition(":")
    return [
        f"image.repository={repository}",
        f"image.tag={tag}",
        # Host network: the container's ports are the machine's, so they must be free ones.
        f"metrics.port={free_port()}",
        f"webhook.port={free_port()}",
        f"probes.port={free_port()}",
        *extra,
    ]


def deployment(rel: Release) -> dict[str, Any]:
    found: dict[str, Any] = kubectl_json(
        rel.cluster, "get", "deployment", rel.name, f"--namespace={rel.namespace}"
    )
    return found


def derive(rel: Release, identity: Identity, tmp_path: Path, tag: str) -> Container:
    cluster = rel.cluster
    body = deployment(rel)

    def data(kind: str) -> Callable[[str], dict[str, str]]:
        def read(name: str) -> dict[str, str]:
            obj = kubectl_json(cluster, "get", kind, name, f"--namespace={rel.namespace}")
            return dict(obj.get("data") or {})

        return read

    return container_from_deployment(
        body,
        name=f"{rel.name}-{tag}-{secrets.token_hex(2)}",
        pod_name=f"{rel.name}-{tag}",
        workdir=tmp_path / tag,
        identity=identity,
        secret=data("secret"),
        config_map=data("configmap"),
    )


def token_identity(rel: Release) -> Identity:
    """The kubelet's ServiceAccount mount: a TokenRequest token of the chart's ServiceAccount."""
    cluster = rel.cluster
    token = cluster.kubectl(
        "create", "token", rel.service_account, f"--namespace={rel.namespace}", "--duration=1h"
    ).strip()
    view = yaml.safe_load(cluster.kubectl("config", "view", "--minify", "--raw", "-o", "yaml"))
    server = view["clusters"][0]["cluster"]
    ca = base64.b64decode(server["certificate-authority-data"])
    return Identity.service_account_token(token, ca, rel.namespace, server["server"])


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as error:
        return int(error.code), error.read().decode()


async def until_ready(container: Container) -> float:
    """Poll the readiness probe as the kubelet does; seconds from the container's start."""
    probe = container.readiness
    assert probe is not None, "the chart's Deployment has no readiness probe"

    def ready() -> bool:
        if not container.running():
            raise AssertionError("the container exited:\n" + container.logs()[-3000:])
        try:
            return get(f"http://127.0.0.1:{probe.port}{probe.path}")[0] == 200
        except OSError:
            return False

    await await_for(f"{container.name} ready ({probe.path})", ready, within=120)
    assert container.started_at is not None
    return time.monotonic() - container.started_at


def assert_no_forbidden(container: Container) -> None:
    bad = [line for line in container.logs().splitlines() if any(f in line for f in FORBIDDEN)]
    assert not bad, "the chart's RBAC refused the operator:\n" + "\n".join(bad[:20])


def test_the_translation_refuses_what_it_cannot_honour(
    release: Callable[..., Release], namespace: str, image: str, tmp_path: Path
) -> None:
    """A pod-spec field the podman translation does not know fails loudly instead of being dropped."""
    rel = release(f"watchNamespaces={{{namespace}}}", *chart_values(image))
    body = deployment(rel)
    identity = Identity(directory="/x", files={}, env={})
    kwargs: dict[str, Any] = {
        "name": "n",
        "pod_name": "p",
        "workdir": tmp_path,
        "identity": identity,
        "secret": lambda _: {},
        "config_map": lambda _: {},
    }
    container = container_from_deployment(body, **kwargs)
    assert container.image == image
    assert any(a.startswith("--log-format=") for a in container.args)
    assert f"--namespace={namespace}" in container.args
    changes: list[tuple[str, str, Any]] = [
        ("", "command", ["sh"]),
        ("", "envFrom", [{"secretRef": {"name": "x"}}]),
        ("", "startupProbe", {"exec": {"command": ["true"]}}),
        ("securityContext", "privileged", True),
        ("securityContext", "procMount", "Unmasked"),
        ("", "env", [{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]),
    ]
    for where, key, value in changes:
        changed = json.loads(json.dumps(body))
        target = changed["spec"]["template"]["spec"]["containers"][0]
        (target[where] if where else target)[key] = value
        with pytest.raises(UnsupportedPodSpec):
            container_from_deployment(changed, **kwargs)


async def test_the_charts_pod_runs_from_the_image_until_its_first_reconcile(
    release: Callable[..., Release],
    namespace: str,
    image: str,
    tmp_path: Path,
    containers: list[Container],
) -> None:
    """Exactly the chart's pod (its ServiceAccount token where the kubelet mounts it): the job
    applied before the container starts is reconciled; health and metrics answer; SIGTERM stops it
    cleanly within the grace period."""
    rel = release(f"watchNamespaces={{{namespace}}}", *chart_values(image))
    cluster = rel.cluster
    await asyncio.to_thread(
        cluster.kubectl, "apply", f"--namespace={namespace}", "-f", "-", input=dispatch_job("first")
    )
    container = derive(rel, token_identity(rel), tmp_path, "sa")
    assert container.image == image
    assert container.env["HOME"] == "/tmp"
    containers.append(container.start())

    def reconciled() -> bool:
        status = get_job(cluster, namespace, "first").get("status") or {}
        return status.get("observedGeneration") is not None

    await await_for("the first reconcile", reconciled, within=120)
    assert container.started_at is not None
    to_reconcile = time.monotonic() - container.started_at
    to_ready = await until_ready(container)
    assert container.liveness is not None
    assert get(f"http://127.0.0.1:{container.liveness.port}{container.liveness.path}")[0] == 200
    code, text = get(f"http://127.0.0.1:{container.ports['metrics']}/metrics")
    assert code == 200
    assert "dispatch_" in text
    exit_code, took = container.stop()
    assert exit_code == 0, (
        f"not a clean stop (137: killed after the grace period):\n{container.logs()[-3000:]}"
    )
    assert_no_forbidden(container)
    figures = {
        "start_to_first_reconcile_s": round(to_reconcile, 2),
        "start_to_ready_s": round(to_ready, 2),
        "sigterm_to_exit_s": round(took, 2),
        "grace_period_s": container.grace_seconds,
    }
    print(f"\nchart pod from {image}: {figures}")


def webhook_certificate(rel: Release, tmp_path: Path) -> str:
    """A kubernetes.io/tls Secret (cert-manager's layout) for the Service name and 127.0.0.1."""
    cert, key, ca = generate_certificates(
        tmp_path / "webhook-cert", [f"{rel.name}-webhook.{rel.namespace}.svc", "127.0.0.1"]
    )
    name = f"{rel.name}-tls"
    rel.cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/tls",
            "metadata": {"name": name, "namespace": rel.namespace},
            "data": {
                "tls.crt": base64.b64encode(cert.read_bytes()).decode(),
                "tls.key": base64.b64encode(key.read_bytes()).decode(),
                "ca.crt": base64.b64encode(ca.read_bytes()).decode(),
            },
        }
    )
    return name


def route_webhooks_to(cluster: KubeCluster, name: str, port: int) -> None:
    """Point the chart's webhook configurations at the container (what the Service would do)."""
    for kind in ("validatingwebhookconfiguration", "mutatingwebhookconfiguration"):
        body = kubectl_json(cluster, "get", kind, name)
        ops: list[dict[str, Any]] = []
        for i, hook in enumerate(body["webhooks"]):
            service = hook["clientConfig"]["service"]
            ops.append({"op": "remove", "path": f"/webhooks/{i}/clientConfig/service"})
            ops.append(
                {
                    "op": "add",
                    "path": f"/webhooks/{i}/clientConfig/url",
                    "value": f"https://127.0.0.1:{port}{service.get('path', '/')}",
                }
            )
        cluster.kubectl("patch", kind, name, "--type=json", "-p", json.dumps(ops))


async def test_the_image_runs_a_lifecycle_with_a_preemption_and_serves_the_webhooks(
    release: Callable[..., Release],
    namespace: str,
    image: str,
    kubeflow: Kubeflow,
    release_monitor: ReleaseMonitor,
    tmp_path: Path,
    containers: list[Container],
) -> None:
    """The chart's pod with its webhooks, under the ServiceAccount's kubeconfig mounted read-only:
    the webhook it serves refuses a bad job and records who applied a good one; that job is
    preempted by the real scheduler, resubmitted and succeeds; SIGTERM stops it cleanly."""
    rel = release(
        f"watchNamespaces={{{namespace}}}",
        *chart_values(image, "webhook.enabled=true", "webhook.failurePolicy=Fail"),
        install=False,
    )
    cluster = rel.cluster
    secret = webhook_certificate(rel, tmp_path)
    rel.install(f"webhook.certSecret={secret}")
    container = derive(rel, Identity.kubeconfig(rel.sa_kubeconfig()), tmp_path, "kc")
    assert container.env["DISPATCH_WEBHOOK_CERT_DIR"] == "/var/run/secrets/dispatch.dev/webhook"
    route_webhooks_to(cluster, rel.name, container.ports["webhook"])
    containers.append(container.start())
    await until_ready(container)

    users_may_submit(cluster)
    alice = cluster.mint_user("alice", [USERS_GROUP])
    bad = yaml.safe_load(
        dispatch_job("restarts", rules=[{"on": ["preempted"], "action": "restart", "budget": 2}])
    )

    def refused() -> str | None:
        try:
            cluster.kubectl(
                "apply", f"--namespace={namespace}", "--dry-run=server", "-f", "-", input=yaml.safe_dump(bad)
            )
        except KubectlError as error:
            return error.stderr if "denied the request" in error.stderr else None
        return None

    message = await await_for("the webhook refusing", refused)
    assert "cannot be enforced" in message

    manifest = yaml.safe_load(dispatch_job("finetune"))
    manifest["metadata"]["annotations"] = {"dispatch.dev/submitted-by": "human:mallory"}
    await asyncio.to_thread(
        cluster.kubectl,
        "apply",
        f"--namespace={namespace}",
        "-f",
        "-",
        input=yaml.safe_dump(manifest),
        kubeconfig=alice,
    )

    async def released(submission: int) -> str:
        def probe() -> str | None:
            for pj in pytorchjobs(cluster, namespace):
                labels = pj["metadata"].get("labels") or {}
                suspended = ((pj.get("spec") or {}).get("runPolicy") or {}).get("suspend")
                if labels.get("dispatch.dev/submission") == str(submission) and not suspended:
                    return str(pj["metadata"]["name"])
            return None

        found: str = await await_for(f"submission {submission} released", probe, within=120)
        return found

    first = await released(1)
    await asyncio.wait_for(kubeflow.wait_pods(namespace, first, 2), 120)
    await kubeflow.preempt(namespace, first)
    second = await released(2)
    await asyncio.wait_for(kubeflow.wait_pods(namespace, second, 2), 120)
    await kubeflow.succeed(namespace, second)
    await await_for(
        "settled",
        lambda: (get_job(cluster, namespace, "finetune").get("status") or {}).get("settled"),
        within=120,
    )
    body = get_job(cluster, namespace, "finetune")
    assert body["status"]["state"] == "succeeded"
    assert history(body) == SEED_HISTORY
    assert body["status"]["submittedBy"] == {"kind": "human", "id": "alice"}, "the mutating webhook"
    release_monitor.assert_held()
    assert release_monitor.max_live.get("finetune", 0) == 1

    code, text = get(f"http://127.0.0.1:{container.ports['metrics']}/metrics")
    assert code == 200
    recoveries = [line for line in text.splitlines() if line.startswith("dispatch_recoveries_total{")]
    assert recoveries == ['dispatch_recoveries_total{cause="preempted",enforcer="supervisor"} 1.0']
    exit_code, took = container.stop()
    assert exit_code == 0, f"not a clean stop:\n{container.logs()[-3000:]}"
    assert_no_forbidden(container)
    print(f"\nlifecycle through {image}: SIGTERM to exit {took:.2f} s (grace {container.grace_seconds} s)")

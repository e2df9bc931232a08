"""Helm and chart helpers for the e2e tier."""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dispatch._constants import CRD_NAME
from tests.integration.conftest import OperatorProcess
from tests.support.kube import KubeCluster

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "dispatch-operator"


class HelmError(RuntimeError):
    def __init__(self, args: Sequence[str], proc: subprocess.CompletedProcess[str]) -> None:
        super().__init__(f"helm {' '.join(args)} exited {proc.returncode}:\n{proc.stderr.strip()}")
        self.stderr = proc.stderr


@dataclass
class Helm:
    binary: str
    cluster: KubeCluster
    home: Path

    def run(self, *args: str, check: bool = True, timeout: float = 180.0) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            # Keep helm's caches and config out of the user's home.
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_DATA_HOME": str(self.home / "data"),
        }
        argv = [self.binary, f"--kubeconfig={self.cluster.kubeconfig}", *args]
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise HelmError(args, proc)
        return proc


def adopt_crd(cluster: KubeCluster, release: str, namespace: str) -> None:
    """Let release RELEASE take over an existing DispatchJob CRD (Helm's documented adoption).

    The CRD outlives every release (``helm.sh/resource-policy: keep``) and the integration tier
    applies it with kubectl; a new release may only manage it once it carries that release's
    ownership metadata.
    """
    found = cluster.kubectl("get", "crd", CRD_NAME, "--ignore-not-found", "-o", "name").strip()
    if not found:
        return
    cluster.kubectl("label", "crd", CRD_NAME, "app.kubernetes.io/managed-by=Helm", "--overwrite")
    cluster.kubectl(
        "annotate",
        "crd",
        CRD_NAME,
        f"meta.helm.sh/release-name={release}",
        f"meta.helm.sh/release-namespace={namespace}",
        "--overwrite",
    )


def short_name(prefix: str) -> str:
    """A short unique name: ServiceAccount identities are certificates whose CN
    (``system:serviceaccount:NS:NAME``) is limited to 64 characters."""
    return f"{prefix}-{secrets.token_hex(3)}"


@dataclass
class Release:
    """One installed release of the chart, in its own namespace, named like its namespace."""

    helm: Helm
    name: str
    namespace: str
    values: list[str] = field(default_factory=list)

    @property
    def cluster(self) -> KubeCluster:
        return self.helm.cluster

    @property
    def service_account(self) -> str:
        return self.name  # fullnameOverride = the release name

    def install_args(self, *values: str) -> list[str]:
        # webhook.enabled=false: the test control plane has no kube-proxy and no endpoints, so the
        # API server could never reach a webhook behind a Service, and with failurePolicy Fail every
        # DispatchJob write in the cluster would be refused. The operator still refuses in status.
        defaults = ("fullnameOverride=" + self.name, "replicas=0", "webhook.enabled=false")
        sets = [f"--set={v}" for v in (*defaults, *self.values, *values)]
        return [self.name, str(CHART), f"--namespace={self.namespace}", *sets]

    def install(self, *values: str) -> None:
        adopt_crd(self.cluster, self.name, self.namespace)
        self.helm.run("install", *self.install_args(*values))

    def upgrade(self, chart: Path = CHART, *values: str) -> None:
        adopt_crd(self.cluster, self.name, self.namespace)
        args = self.install_args(*values)
        args[1] = str(chart)
        self.helm.run("upgrade", *args)

    def uninstall(self, check: bool = True) -> None:
        self.helm.run("uninstall", self.name, f"--namespace={self.namespace}", check=check)

    def manifest(self) -> list[dict[str, Any]]:
        import yaml

        text = self.helm.run("get", "manifest", self.name, f"--namespace={self.namespace}").stdout
        return [d for d in yaml.safe_load_all(text) if d]

    def sa_kubeconfig(self) -> Path:
        return self.cluster.serviceaccount_kubeconfig(self.namespace, self.service_account)

    def can_i(self, verb: str, resource: str, namespace: str | None = None, *extra: str) -> bool:
        """`kubectl auth can-i` asked by the operator's own identity (a SelfSubjectAccessReview)."""
        ns = [f"--namespace={namespace}"] if namespace else []
        resource, _, sub = resource.partition("/")
        subresource = [f"--subresource={sub}"] if sub else []
        out = self.cluster.kubectl(
            "auth",
            "can-i",
            verb,
            resource,
            *subresource,
            *ns,
            *extra,
            kubeconfig=self.sa_kubeconfig(),
            check=False,
        )
        return out.strip() == "yes"


def kubectl_json(cluster: KubeCluster, *args: str) -> Any:
    return json.loads(cluster.kubectl(*args, "-o", "json"))


def lines(text: str) -> Iterator[str]:
    yield from (line for line in text.splitlines() if line.strip())


FORBIDDEN_IN_LOG = re.compile(r"\b403 Forbidden\b|\bforbidden\b|\bForbidden\b")


def start_operator(
    release: Release,
    namespace: str,
    tmp_path: Path,
    *args: str,
    env: dict[str, str] | None = None,
    tag: str = "",
) -> OperatorProcess:
    """An operator process under the release's service account (the chart's RBAC), started."""
    op = OperatorProcess(
        kubeconfig=release.sa_kubeconfig(),
        namespace=namespace,
        log_path=tmp_path / f"operator{tag}.log",
        args=args,
        env=env or {},
    )
    return op.start()


def assert_no_forbidden(*ops: OperatorProcess) -> None:
    """No line of the operators' logs says the API server refused them (a hole in the chart's RBAC)."""
    for op in ops:
        log = op.log()
        bad = [line for line in log.splitlines() if FORBIDDEN_IN_LOG.search(line)]
        assert not bad, f"{op.log_path.name}: the chart's RBAC refused the operator:\n" + "\n".join(bad[:20])


async def kubectl_wait(cluster: KubeCluster, namespace: str, name: str, condition_type: str) -> None:
    """``kubectl wait`` for a condition of a DispatchJob, as a user (or a pipeline) waits."""
    await asyncio.to_thread(
        cluster.kubectl,
        "wait",
        f"--namespace={namespace}",
        f"dispatchjob/{name}",
        f"--for=condition={condition_type}",
        "--timeout=120s",
        timeout=150,
    )

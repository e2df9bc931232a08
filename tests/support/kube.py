"""pytest plugin: a real Kubernetes API for integration tests.

Register with ``pytest_plugins = ["tests.support.kube"]`` (or ``-p tests.support.kube``).

Fixtures
--------
``kube_cluster`` (session)
    By default starts a private control plane (etcd + kube-apiserver, see
    :mod:`tests.support.controlplane`; binaries from ``make bins``). When the environment
    variable ``DISPATCH_E2E_KUBECONFIG`` names a kubeconfig, that existing cluster (kind,
    a real one) is used instead and nothing is started.
``namespace`` (function)
    A fresh, uniquely named namespace per test; deletion is requested afterwards
    (``--wait=false``).

What a bare apiserver does NOT do (tests must not depend on any of it)
----------------------------------------------------------------------
The private control plane runs only etcd and kube-apiserver, like controller-runtime's
envtest. There is no kube-controller-manager, scheduler or kubelet, therefore:

* no garbage collector: objects with ownerReferences are not deleted with their owner;
  ``foregroundDeletion``/``orphan`` finalizers are never processed;
* no namespace finalization: a deleted namespace stays ``Terminating`` forever and its
  objects stay (the ``namespace`` fixture therefore only *requests* deletion; the whole
  control plane is thrown away at the end of the session);
* no scheduler and no kubelet: Pods stay ``Pending`` without a node, never run, never
  get container statuses; Deployments/Jobs/StatefulSets create no Pods at all (no
  controllers);
* no ServiceAccount token controller and no ``default`` ServiceAccount (the
  ServiceAccount admission plugin is disabled); the TokenRequest API itself works;
* no Endpoints/EndpointSlices, no certificate signing/approval, no node lifecycle.

What it does do: the full API surface (CRDs with schema validation, status and scale
subresources, server-side apply, watches, resourceVersion preconditions, RBAC
authorization, admission incl. ValidatingAdmissionPolicy, TokenRequest). If a test needs
controller behaviour, kube-controller-manager could be built from k8s.io/kubernetes the
same way ``hack/build-bins.sh`` builds kube-apiserver, or run it against a kind cluster
(``make e2e-kind``).

Identities
----------
``kube_cluster.mint_user(name, groups)`` and
``kube_cluster.serviceaccount_kubeconfig(namespace, name)`` return kubeconfig paths. On
the private control plane both are client certificates (CN = user, O = groups). On an
existing cluster, ``serviceaccount_kubeconfig`` creates the ServiceAccount if needed and
uses a token from the TokenRequest API; ``mint_user`` cannot create arbitrary users there
and skips the test with an explanation.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.controlplane import ControlPlane, resolve_binaries

E2E_KUBECONFIG_ENV = "DISPATCH_E2E_KUBECONFIG"
FIELD_MANAGER = "dispatch-tests"

Manifest = str | Path | Mapping[str, Any] | Sequence[Mapping[str, Any]]


class KubectlError(RuntimeError):
    """kubectl exited non-zero."""

    def __init__(self, args: Sequence[str], returncode: int, stdout: str, stderr: str) -> None:
        super().__init__(f"kubectl {' '.join(args)} exited {returncode}:\n{stderr.strip() or stdout.strip()}")
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr


@dataclass
class KubeCluster:
    """A reachable cluster plus small kubectl-based helpers."""

    kubeconfig: Path
    kubectl_bin: str
    workdir: Path
    control_plane: ControlPlane | None = None
    _token_kubeconfigs: dict[tuple[str, str], Path] = field(default_factory=dict)

    @property
    def external(self) -> bool:
        """True when running against an existing cluster (``DISPATCH_E2E_KUBECONFIG``)."""
        return self.control_plane is None

    # ---- kubectl ---------------------------------------------------------------------

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        kubeconfig: Path | None = None,
        check: bool = True,
        timeout: float = 120.0,
    ) -> str:
        """Run kubectl against this cluster; return stdout (raise KubectlError on failure)."""
        argv = [self.kubectl_bin, f"--kubeconfig={kubeconfig or self.kubeconfig}", *args]
        proc = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise KubectlError(args, proc.returncode, proc.stdout, proc.stderr)
        return proc.stdout

    def apply(self, manifest: Manifest, *, namespace: str | None = None) -> str:
        """Server-side apply a manifest: YAML text, a file/directory path, or object(s)."""
        ns = [f"--namespace={namespace}"] if namespace else []
        base = ["apply", "--server-side", f"--field-manager={FIELD_MANAGER}", "--force-conflicts", *ns]
        if isinstance(manifest, Path):
            return self.kubectl(*base, "-f", str(manifest))
        if isinstance(manifest, str):
            return self.kubectl(*base, "-f", "-", input=manifest)
        docs: Sequence[Mapping[str, Any]] = [manifest] if isinstance(manifest, Mapping) else manifest
        text = yaml.safe_dump_all([dict(d) for d in docs], sort_keys=False)
        return self.kubectl(*base, "-f", "-", input=text)

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        ns = [f"--namespace={namespace}"] if namespace else []
        obj: dict[str, Any] = json.loads(self.kubectl("get", kind, name, *ns, "-o", "json"))
        return obj

    def wait_for_condition(
        self,
        kind: str,
        name: str,
        namespace: str | None,
        condition: str,
        timeout: float = 60.0,
    ) -> None:
        """Wait until ``status.conditions[type=CONDITION].status == "True"``."""
        ns = [f"--namespace={namespace}"] if namespace else []
        self.kubectl(
            "wait",
            f"{kind}/{name}",
            *ns,
            f"--for=condition={condition}",
            f"--timeout={int(timeout)}s",
            timeout=timeout + 30,
        )

    # ---- identities ------------------------------------------------------------------

    def mint_user(self, name: str, groups: Sequence[str] = ()) -> Path:
        """Kubeconfig for user NAME in GROUPS (client cert); skips on an existing cluster."""
        if self.control_plane is None:
            pytest.skip(
                f"mint_user({name!r}) needs the private control plane (client certificates); "
                f"an existing cluster ({E2E_KUBECONFIG_ENV}) can only provide ServiceAccount "
                "identities (use serviceaccount_kubeconfig)"
            )
        return self.control_plane.mint_user(name, groups)

    def serviceaccount_kubeconfig(self, namespace: str, name: str) -> Path:
        """Kubeconfig acting as ``system:serviceaccount:NAMESPACE:NAME``.

        On the private control plane a client certificate stands in for the token, unless the
        user name does not fit a certificate's common name (64 characters): then, as on an
        existing cluster, a token from the TokenRequest API.
        """
        user = f"system:serviceaccount:{namespace}:{name}"
        if self.control_plane is not None and len(user) <= 64:
            return self.control_plane.serviceaccount_kubeconfig(namespace, name)
        key = (namespace, name)
        if key not in self._token_kubeconfigs:
            self._token_kubeconfigs[key] = self._token_kubeconfig(namespace, name)
        return self._token_kubeconfigs[key]

    def _token_kubeconfig(self, namespace: str, name: str) -> Path:
        self.apply(
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": namespace}}
        )
        token = self.kubectl("create", "token", name, f"--namespace={namespace}", "--duration=2h").strip()
        view = yaml.safe_load(self.kubectl("config", "view", "--minify", "--raw", "-o", "yaml"))
        cluster = view["clusters"][0]
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [cluster],
            "users": [{"name": f"sa-{namespace}-{name}", "user": {"token": token}}],
            "contexts": [
                {
                    "name": "sa",
                    "context": {
                        "cluster": cluster["name"],
                        "user": f"sa-{namespace}-{name}",
                        "namespace": namespace,
                    },
                }
            ],
            "current-context": "sa",
        }
        path = self.workdir / "users" / f"sa-{namespace}-{name}.kubeconfig"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        path.chmod(0o600)
        return path


def _kubectl_for_external() -> str:
    try:
        return resolve_binaries().kubectl
    except RuntimeError:
        found = shutil.which("kubectl")
        if found is None:
            raise
        return found


@pytest.fixture(scope="session")
def kube_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeCluster]:
    """A Kubernetes API for the whole session (private control plane or DISPATCH_E2E_KUBECONFIG)."""
    workdir = tmp_path_factory.mktemp("kube")
    external = os.environ.get(E2E_KUBECONFIG_ENV)
    if external:
        yield KubeCluster(kubeconfig=Path(external), kubectl_bin=_kubectl_for_external(), workdir=workdir)
        return
    try:
        binaries = resolve_binaries()
    except RuntimeError as e:
        pytest.fail(str(e), pytrace=False)
    cp = ControlPlane(workdir / "controlplane", binaries=binaries)
    try:
        cp.start()
        yield KubeCluster(
            kubeconfig=cp.kubeconfig,
            kubectl_bin=binaries.kubectl,
            workdir=workdir,
            control_plane=cp,
        )
    finally:
        cp.stop()


def _namespace_name(nodeid: str) -> str:
    test = nodeid.rsplit("::", 1)[-1]
    base = re.sub(r"[^a-z0-9-]+", "-", test.lower()).strip("-")[:40].strip("-") or "test"
    return f"t-{base}-{secrets.token_hex(3)}"


@pytest.fixture
def namespace(kube_cluster: KubeCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A unique namespace for one test. Deletion is only requested: a bare apiserver never
    finishes it (no namespace controller), so do not assert on it."""
    name = _namespace_name(request.node.nodeid)
    kube_cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    try:
        yield name
    finally:
        kube_cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)

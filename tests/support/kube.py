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
    (``--wait=false``; the namespace controller finishes it).

The private cluster is the lab (:mod:`tests.support.lab`)
-------------------------------------------------------
etcd + kube-apiserver + kube-scheduler + kube-controller-manager + kwok (3 nodes, the kubelet's
part played by kwok stages) + Kubeflow's real training operator with its validating webhook, one
per session. Controllers run: garbage collection, namespace deletion, taint eviction, pod GC,
node lifecycle, Jobs. ``kube_cluster.lab`` is the :class:`~tests.support.lab.Lab` (None on an
existing cluster); the ``lab`` fixture is the same object and skips on an existing cluster;
the ``kubeflow`` fixture (per test) is the async :class:`~tests.support.lab.Kubeflow` facade,
which undoes the node changes a test made.

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

import contextlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatch._constants import FINALIZER, GROUP, OBJECT_FINALIZER, PLURAL
from dispatch._registry import kubernetes_backends
from tests.support.controlplane import ControlPlane, resolve_binaries
from tests.support.lab import Kubectl, Kubeflow, Lab, LabError, wait_established

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
    lab: Lab | None = None
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

    def wait_established(self, *crds: str, timeout: float = 60.0) -> None:
        """Until each CRD (``plural.group``) is Established (:func:`tests.support.lab.wait_established`)."""
        wait_established(self.kubectl, crds, timeout)

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


@contextlib.contextmanager
def lab_cluster(workdir: Path, **lab_args: Any) -> Iterator[KubeCluster]:
    """A private lab (tests.support.lab) in ``workdir``, started, as a :class:`KubeCluster`;
    stopped on exit. No binaries or a lab that does not start fails the test without a traceback."""
    try:
        binaries = resolve_binaries()
    except RuntimeError as e:
        pytest.fail(str(e), pytrace=False)
    running = Lab(workdir / "lab", **lab_args)
    running.cp.binaries = binaries
    try:
        try:
            running.start()
        except LabError as e:
            pytest.fail(str(e), pytrace=False)
        print(f"\nlab up in {running.start_seconds:.1f}s ({running.dir})", file=sys.stderr)
        yield KubeCluster(
            kubeconfig=running.kubeconfig,
            kubectl_bin=binaries.kubectl,
            workdir=workdir,
            control_plane=running.cp,
            lab=running,
        )
    finally:
        running.stop()


@pytest.fixture(scope="session")
def kube_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeCluster]:
    """A Kubernetes API for the whole session (the private lab, or DISPATCH_E2E_KUBECONFIG)."""
    workdir = tmp_path_factory.mktemp("kube")
    external = os.environ.get(E2E_KUBECONFIG_ENV)
    if external:
        yield KubeCluster(kubeconfig=Path(external), kubectl_bin=_kubectl_for_external(), workdir=workdir)
        return
    with lab_cluster(workdir) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def lab(kube_cluster: KubeCluster) -> Lab:
    """The session's lab; a test that needs one of its mechanisms skips on an existing cluster."""
    if kube_cluster.lab is None:
        pytest.skip(f"needs the private lab (kwok nodes, its mechanisms); {E2E_KUBECONFIG_ENV} is set")
    return kube_cluster.lab


@pytest.fixture(scope="session")
def lab_extras(lab: Lab) -> Lab:
    """The session's lab with JobSet and Kubeflow Trainer v2 started on it (once, on first use:
    about 10 s). One lab per session holds them: Trainer's cert dir is machine-global, and a
    second lab's Trainer waits for it (see tests.support.lab)."""
    try:
        lab.start_extras(("jobset", "trainer"))
    except LabError as e:
        pytest.fail(str(e), pytrace=False)
    print(f"\nlab extras up in {lab.extras_seconds}", file=sys.stderr)
    return lab


@pytest.fixture
def kubeflow(lab: Lab) -> Iterator[Kubeflow]:
    """The lab's failure mechanisms for one test (async); node changes are undone afterwards."""
    facade = Kubeflow(lab)
    try:
        yield facade
    finally:
        facade.restore()


def _namespace_name(nodeid: str) -> str:
    test = nodeid.rsplit("::", 1)[-1]
    base = re.sub(r"[^a-z0-9-]+", "-", test.lower()).strip("-")[:40].strip("-") or "test"
    return f"t-{base}-{secrets.token_hex(3)}"


@pytest.fixture
def namespace(kube_cluster: KubeCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A unique namespace for one test. Deletion is only requested (the namespace controller
    finishes it in the background; on an existing cluster likewise)."""
    name = _namespace_name(request.node.nodeid)
    kube_cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    try:
        yield name
    finally:
        let_go(kube_cluster, name)
        kube_cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


def workload_kinds() -> tuple[str, ...]:
    """The kinds dispatch creates (``plural.group``), each carrying its finalizer: what every
    registered Kubernetes backend's declared rules allow it to create (so a new backend needs no
    edit here)."""
    return tuple(
        sorted(
            {
                f"{res}.{group}" if group else res
                for backend in kubernetes_backends()
                for rule in backend.rbac
                if "create" in rule.verbs
                for group in rule.api_groups
                for res in rule.resources
            }
        )
    )


def let_go(cluster: KubeCluster, namespace: str) -> None:
    """Remove dispatch's finalizer from what is left in ``namespace``, as an administrator would
    once no operator runs: a test that supervised without the operator (or stopped it) must not
    leave objects, and their pods on the lab's nodes, held by it after the namespace is deleted."""
    release_finalizers(cluster.kubectl, namespace, workload_kinds())
    # DispatchJobs too: the mutating webhook gives each the loop's finalizer on creation.
    release_finalizers(cluster.kubectl, namespace, (f"{PLURAL}.{GROUP}",))


def release_finalizers(kubectl: Kubectl, namespace: str, kinds: Sequence[str]) -> None:
    """Remove dispatch's finalizer (an object's, or a DispatchJob's) from every object of
    ``kinds`` (``plural.group``) in ``namespace``. hack/'s recorders use it too."""
    items = _items(kubectl, namespace, ",".join(kinds))  # one request for every kind...
    if items is None and len(kinds) > 1:  # ...or one per kind when a CRD is not served
        items = [item for kind in kinds for item in _items(kubectl, namespace, kind) or ()]
    for item in items or ():
        finalizers = item["metadata"].get("finalizers") or []
        held = next((f for f in (OBJECT_FINALIZER, FINALIZER) if f in finalizers), None)
        if held is None:
            continue
        at = f"/metadata/finalizers/{finalizers.index(held)}"
        patch = [{"op": "test", "path": at, "value": held}, {"op": "remove", "path": at}]
        group = item["apiVersion"].rpartition("/")[0]
        kind = f"{item['kind'].lower()}.{group}" if group else item["kind"].lower()
        kubectl(
            "patch",
            kind,
            item["metadata"]["name"],
            "-n",
            namespace,
            "--type=json",
            f"--patch={json.dumps(patch)}",
            check=False,
        )


def _items(kubectl: Kubectl, namespace: str, kinds: str) -> list[dict[str, Any]] | None:
    out = kubectl("get", kinds, "-n", namespace, "-o", "json", check=False)
    try:
        items: list[dict[str, Any]] = json.loads(out)["items"]
    except (ValueError, KeyError):
        return None
    return items

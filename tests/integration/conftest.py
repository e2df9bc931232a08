"""Fixtures for the operator's integration tests: the CRDs installed, the operator as a process.

The operator runs as ``python -m dispatch._controller --kubeconfig ... --namespace NS`` in its own
process group, so a test can SIGKILL it and start it again. ``DISPATCH_TEST_CRASH_AFTER=Step:n``
starts it as ``python -m tests.support.crash_after`` instead, which SIGKILLs itself right after
the n-th step of that kind has landed: a crash at an exact point of the submission protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml

from dispatch._controller import webhook
from dispatch._controller.main import _connection_info
from dispatch._controller.settings import operator_settings
from dispatch._kubeclient import KubeClient, load_configuration, new_client, streamed
from tests.support import builders
from tests.support.crash_after import CRASH_ENV
from tests.support.kube import KubeCluster, KubectlError
from tests.support.lab import Kubeflow, Lab
from tests.support.node import NodeError, RealNode

REPO = Path(__file__).resolve().parents[2]
DISPATCH_CRD = REPO / "crds" / "dispatch.dev_dispatchjobs.yaml"
WAIT = 90.0
"""How long a test waits for something to happen before it fails (never asserted as a duration)."""


def install_crds(cluster: KubeCluster) -> KubeCluster:
    """The DispatchJob CRD (the committed, generated file), established, next to Kubeflow's
    PyTorchJob CRD (installed with the real training operator: by the lab, or on an existing
    cluster by whoever installed Kubeflow)."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(DISPATCH_CRD))
    cluster.wait_established("dispatchjobs.dispatch.dev", "pytorchjobs.kubeflow.org")
    return cluster


@pytest.fixture(scope="session")
def crds(kube_cluster: KubeCluster) -> KubeCluster:
    """The session's cluster with :func:`install_crds`."""
    return install_crds(kube_cluster)


@pytest.fixture(scope="session")
def real_node(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealNode]:
    """A real node (kubelet, containerd, CoreDNS: tests.support.node) joined to the session's lab
    on first use, stopped at the end of the session. Only pods that select and tolerate it
    (``RealNode.placement``) land there; every other pod keeps to kwok's nodes."""
    node = RealNode(lab, tmp_path_factory.mktemp("node"))
    try:
        node.start()
    except NodeError as e:
        with contextlib.suppress(NodeError):
            node.stop()
        pytest.fail(str(e), pytrace=False)
    print(
        f"\nreal node Ready {node.ready_seconds:.1f}s after kubelet start ({node.start_seconds:.1f}s in all)",
        file=sys.stderr,
    )
    try:
        yield node
    finally:
        node.stop()


# ---- the operator as a process ------------------------------------------------------------------


@dataclass
class OperatorProcess:
    """One ``python -m dispatch._controller`` process; its output goes to ``log_path``."""

    kubeconfig: Path
    namespace: str
    log_path: Path
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    def start(self, *, env: Mapping[str, str] | None = None) -> OperatorProcess:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.starts += 1
        environment = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env, **(env or {})}
        crashing = bool(environment.get(CRASH_ENV))
        argv = [
            sys.executable,
            "-m",
            "tests.support.crash_after" if crashing else "dispatch._controller",
            f"--kubeconfig={self.kubeconfig}",
            f"--namespace={self.namespace}",
            "--poll-interval=2",
            "--log-level=INFO",
            *self.args,
        ]
        with self.log_path.open("ab") as log:
            log.write(f"\n===== start {self.starts}: {' '.join(argv[1:])} env={dict(env or {})}\n".encode())
            self.proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, env=environment, start_new_session=True, cwd=REPO
            )
        return self

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: no cleanup, no finalizer removal, nothing."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def wait_exit(self, timeout: float = WAIT) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@pytest.fixture
def operator(
    crds: KubeCluster, namespace: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., OperatorProcess]]:
    """A factory of operator processes watching the test's namespace; all are stopped afterwards."""
    made: list[OperatorProcess] = []

    def make(*args: str, env: Mapping[str, str] | None = None, start: bool = True) -> OperatorProcess:
        op = OperatorProcess(
            kubeconfig=crds.kubeconfig,
            namespace=namespace,
            log_path=tmp_path / f"operator-{len(made)}.log",
            args=args,
            env=dict(env or {}),
        )
        made.append(op)
        return op.start() if start else op

    yield make
    for op in made:
        op.stop()
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        for op in made:
            sys.stderr.write(f"\n----- {op.log_path.name} (last 200 lines)\n")
            sys.stderr.write("\n".join(op.log().splitlines()[-200:]) + "\n")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


# ---- manifests like a user's --------------------------------------------------------------------


def dispatch_job(
    name: str,
    *,
    rules: list[dict[str, Any]] | None = None,
    nodes: int = 2,
    backend: str = "kubeflow",
    image: str = "pytorch/pytorch:2.4",
    extra_spec: Mapping[str, Any] | None = None,
) -> str:
    """A DispatchJob manifest as a user would write it (YAML text)."""
    spec: dict[str, Any] = {
        "nodes": nodes,
        "kubeflow": {"image": image, "resources": dict(builders.RESOURCES)},
        "recovery": {"rules": rules if rules is not None else [{"on": ["preempted"], "budget": 2}]},
    }
    spec.update(extra_spec or {})
    # extra_spec may change the backend or the command too (the refusal tests do)
    chosen = str(spec.pop("backend", backend))
    command = list(spec.pop("command", ["torchrun", "train.py"]))
    return builders.manifest(name, backend=chosen, command=command, **spec)


def apply(
    cluster: KubeCluster, namespace: str, manifest: str, *, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """``kubectl apply -f -`` (client-side, like a user); returns the completed process."""
    proc = subprocess.run(
        [cluster.kubectl_bin, f"--kubeconfig={cluster.kubeconfig}", "-n", namespace, "apply", "-f", "-"],
        input=manifest,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"kubectl apply failed: {proc.stderr}")
    return proc


async def apply_claiming(
    cluster: KubeCluster, namespace: str, name: str, kubeconfig: Path, claimed: str = "human:mallory"
) -> None:
    """``kubectl apply`` of the tutorial's job as the user of ``kubeconfig``, with a forged
    ``dispatch.dev/submitted-by`` annotation: the webhook must stamp the real user over it."""
    manifest = yaml.safe_load(builders.seed_job(name))
    manifest["metadata"]["annotations"] = {"dispatch.dev/submitted-by": claimed}
    await asyncio.to_thread(
        cluster.kubectl,
        "apply",
        "-n",
        namespace,
        "-f",
        "-",
        input=yaml.safe_dump(manifest),
        kubeconfig=kubeconfig,
    )


def get_job(cluster: KubeCluster, namespace: str, name: str) -> dict[str, Any]:
    return cluster.get("dispatchjob", name, namespace)


def pytorchjobs(cluster: KubeCluster, namespace: str) -> list[dict[str, Any]]:
    out = json.loads(cluster.kubectl("get", "pytorchjobs", "-n", namespace, "-o", "json"))
    items: list[dict[str, Any]] = out["items"]
    return items


def condition(body: Mapping[str, Any], kind: str) -> dict[str, Any] | None:
    for c in (body.get("status") or {}).get("conditions") or ():
        if c.get("type") == kind:
            return dict(c)
    return None


def wait_for(what: str, probe: Callable[[], Any], timeout: float = WAIT, interval: float = 0.2) -> Any:
    """Poll ``probe`` until it returns something truthy; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            last = probe()
            if last:
                return last
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}; last probe: {last!r}")


async def await_for(what: str, probe: Callable[[], Any], within: float = WAIT, interval: float = 0.2) -> Any:
    """Like :func:`wait_for` without blocking the event loop: a plain ``probe`` runs in a thread."""
    deadline = time.monotonic() + within
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = probe() if asyncio.iscoroutinefunction(probe) else await asyncio.to_thread(probe)
            if asyncio.iscoroutine(last):
                last = await last
        except Exception as error:
            last = error
        else:
            if last:
                return last
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}; last probe: {last!r}")


async def settled(cluster: KubeCluster, namespace: str, name: str) -> dict[str, Any]:
    """The DispatchJob once its status says settled (waits up to WAIT)."""
    body: dict[str, Any] = await await_for(
        f"{name} settled",
        lambda: (b := get_job(cluster, namespace, name)).get("status", {}).get("settled") and b,
    )
    return body


def history(body: Mapping[str, Any]) -> list[tuple[str, str, int, str]]:
    return [
        (h["from"], h["to"], h["submission"], h["cause"]["kind"])
        for h in (body.get("status") or {}).get("history") or ()
    ]


# ---- watching released PyTorchJobs --------------------------------------------------------------


@dataclass
class ReleaseMonitor:
    """Follows every PyTorchJob of a namespace through a watch and checks invariant 1 at EVERY
    event: no DispatchJob (label ``dispatch.dev/job``) ever has two released PyTorchJobs (not
    suspended, not ended) at once. A snapshot between events could miss a short overlap; the
    watch delivers each state the API server held, in order."""

    released: dict[str, set[str]] = field(default_factory=dict)
    max_live: dict[str, int] = field(default_factory=dict)
    suspended: Callable[[Mapping[str, Any]], bool] = field(
        default=lambda obj: bool(((obj.get("spec") or {}).get("runPolicy") or {}).get("suspend"))
    )
    """How the watched kind says it is held (PyTorchJob's ``runPolicy.suspend`` by default)."""
    finished: tuple[str, ...] = ("Succeeded", "Failed")
    """The kind's condition types that say it has finished for good."""
    violations: list[str] = field(default_factory=list)
    _live: dict[str, dict[str, bool]] = field(default_factory=dict)
    events: int = 0

    def see(self, kind: str, obj: Mapping[str, Any]) -> None:
        self.events += 1
        meta = obj.get("metadata") or {}
        job = (meta.get("labels") or {}).get("dispatch.dev/job")
        if not job:
            return
        name = str(meta.get("name"))
        suspended = self.suspended(obj)
        ended = kind == "DELETED" or _object_ended(obj, self.finished)
        live = self._live.setdefault(job, {})
        if not suspended and not ended:
            self.released.setdefault(job, set()).add(name)
            live[name] = True
        else:
            live.pop(name, None)
        self.max_live[job] = max(self.max_live.get(job, 0), len(live))
        if len(live) > 1:
            self.violations.append(
                f"event {self.events} ({kind} {name} rv={meta.get('resourceVersion')}): "
                f"{job} has released {sorted(live)}"
            )

    def relisted(self) -> None:
        """A new list replaces what the watch knew (objects deleted meanwhile sent no event)."""
        self._live.clear()

    def assert_held(self) -> None:
        """Fail with every violating event, if any; and fail if the watch saw nothing at all."""
        assert self.events > 0, "the PyTorchJob watch saw no event"
        assert not self.violations, "two released PyTorchJobs of one job at once:\n" + "\n".join(
            self.violations
        )


def _object_ended(obj: Mapping[str, Any], finished: tuple[str, ...]) -> bool:
    meta = obj.get("metadata") or {}
    if meta.get("deletionTimestamp") or (meta.get("annotations") or {}).get("dispatch.dev/ended"):
        return True
    return any(
        c.get("type") in finished and c.get("status") == "True"
        for c in (obj.get("status") or {}).get("conditions") or ()
    )


@pytest.fixture
async def release_monitor(crds: KubeCluster, namespace: str) -> AsyncIterator[ReleaseMonitor]:
    """A ReleaseMonitor fed by a watch on the namespace's PyTorchJobs for the whole test."""
    async with follow_releases(
        crds, namespace, ("kubeflow.org", "v1", "pytorchjobs"), ReleaseMonitor()
    ) as monitor:
        yield monitor


@contextlib.asynccontextmanager
async def follow_releases(
    cluster: KubeCluster, namespace: str, resource: tuple[str, str, str], monitor: ReleaseMonitor
) -> AsyncIterator[ReleaseMonitor]:
    """Feed ``monitor`` from a watch on ``resource`` (group, version, plural) in ``namespace``."""
    from kubernetes_asyncio import config as kconfig
    from kubernetes_asyncio.client import ApiClient, Configuration, CustomObjectsApi

    group, version, plural = resource
    cfg = Configuration()
    await kconfig.load_kube_config(config_file=str(cluster.kubeconfig), client_configuration=cfg)
    async with ApiClient(configuration=cfg) as api:
        custom = CustomObjectsApi(api)

        async def follow() -> None:
            rv: str | None = None
            while True:
                try:
                    if rv is None:
                        response = await custom.list_namespaced_custom_object(
                            group, version, namespace, plural, _preload_content=False
                        )
                        async with streamed(response):  # a cancel mid-read lets the socket go at once
                            response.raise_for_status()
                            listed = json.loads(await response.read())
                        monitor.relisted()
                        for item in listed.get("items", []):
                            monitor.see("ADDED", item)
                        rv = listed["metadata"]["resourceVersion"]
                    response = await custom.list_namespaced_custom_object(
                        group,
                        version,
                        namespace,
                        plural,
                        watch=True,
                        resource_version=rv,
                        timeout_seconds=60,
                        _preload_content=False,
                    )
                    async with streamed(response):
                        buffer = b""
                        async for chunk in response.content.iter_any():
                            buffer += chunk
                            while b"\n" in buffer:
                                line, buffer = buffer.split(b"\n", 1)
                                if not line.strip():
                                    continue
                                event = json.loads(line)
                                if event["type"] == "ERROR":
                                    rv = None
                                    break
                                rv = event["object"]["metadata"]["resourceVersion"]
                                monitor.see(event["type"], event["object"])
                except asyncio.CancelledError:
                    raise
                except Exception:
                    await asyncio.sleep(0.2)

        task = asyncio.create_task(follow())
        try:
            yield monitor
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    await asyncio.sleep(0.1)  # the aborted watch's socket closes on the next turn of the loop


# ---- an API client ------------------------------------------------------------------------------


@pytest.fixture
async def api(crds: KubeCluster) -> AsyncIterator[KubeClient]:
    """An admin API client built as dispatch builds its own (``dispatch._kubeclient.new_client``)."""
    client = await new_client(str(crds.kubeconfig))
    async with client:
        yield client
    await asyncio.sleep(0.1)  # TLS transports close on the next turns of the loop (else ResourceWarning)


def released(pj: Mapping[str, Any]) -> bool:
    return not bool(((pj.get("spec") or {}).get("runPolicy") or {}).get("suspend"))


async def released_pj(
    cluster: KubeCluster, namespace: str, submission: int, *, job: str | None = None, within: float = WAIT
) -> dict[str, Any]:
    """The namespace's released PyTorchJob of ``submission`` (of DispatchJob ``job`` when named;
    waits up to ``within``)."""

    def probe() -> dict[str, Any] | None:
        for pj in pytorchjobs(cluster, namespace):
            labels = pj["metadata"].get("labels") or {}
            mine = job is None or labels.get("dispatch.dev/job") == job
            if mine and labels.get("dispatch.dev/submission") == str(submission) and released(pj):
                return pj
        return None

    what = f"{job} submission {submission} released" if job else f"submission {submission} released"
    found: dict[str, Any] = await await_for(what, probe, within=within)
    return found


async def running_pj(
    cluster: KubeCluster, namespace: str, job: str, submission: int, kubeflow: Kubeflow
) -> str:
    """The released PyTorchJob of (job, submission) once its pods run; returns its name."""

    def probe() -> str | None:
        for pj in pytorchjobs(cluster, namespace):
            labels = pj["metadata"].get("labels") or {}
            if (
                labels.get("dispatch.dev/job") == job
                and labels.get("dispatch.dev/submission") == str(submission)
                and released(pj)
            ):
                return str(pj["metadata"]["name"])
        return None

    name: str = await await_for(f"{job} submission {submission} released", probe)
    await asyncio.wait_for(kubeflow.wait_pods(namespace, name, 1), 60)
    return name


def pj_conditions(pj: Mapping[str, Any]) -> dict[str, str]:
    return {c["type"]: c["status"] for c in (pj.get("status") or {}).get("conditions") or ()}


# ---- helpers shared by the webhook, HA and CLI tests ------------------------------------------------

USERS_GROUP = "dispatch-users"
"""The group of the test identities that may submit DispatchJobs (see ``users_may_submit``)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def users_may_submit(cluster: KubeCluster) -> None:
    cluster.apply(
        [
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": "dispatch-test-users"},
                "rules": [
                    {
                        "apiGroups": ["dispatch.dev"],
                        "resources": ["dispatchjobs"],
                        "verbs": ["get", "list", "watch", "create", "update", "patch"],
                    }
                ],
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": "dispatch-test-users"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "dispatch-test-users",
                },
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": USERS_GROUP}],
            },
        ]
    )


# ---- the admission webhooks alone ------------------------------------------------------------------


class WebhookOperator:
    """A kopf operator with only dispatch's admission handlers, in a thread with its own loop."""

    def __init__(self, kubeconfig: Path, managed: str) -> None:
        self.kubeconfig = kubeconfig
        self.managed = managed
        self.port = free_port()
        self.error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="webhook-operator", daemon=True)

    def start(self) -> None:
        self._thread.start()
        assert self._started.wait(60), "the operator thread never started"

    def close(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as error:
            self.error = error
            self._started.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        configuration = await load_configuration(str(self.kubeconfig))
        registry = kopf.OperatorRegistry()
        settings = operator_settings()

        @kopf.on.login(registry=registry)
        def login(**_: Any) -> kopf.ConnectionInfo:
            return _connection_info(configuration)

        webhook.setup(
            registry=registry,
            settings=settings,
            port=self.port,
            addr="127.0.0.1",
            host="127.0.0.1",
            managed=self.managed,
        )
        self._started.set()
        await kopf.operator(
            registry=registry, settings=settings, standalone=True, clusterwide=True, stop_flag=self._stop
        )


@pytest.fixture(scope="module")
def admission(crds: KubeCluster) -> Iterator[WebhookOperator]:
    kube_cluster = crds
    users_may_submit(kube_cluster)
    managed = f"t{secrets.token_hex(3)}.dispatch.dev"
    operator = WebhookOperator(kube_cluster.kubeconfig, managed)
    operator.start()
    try:
        _wait_until_serving(kube_cluster, operator)
        yield operator
    finally:
        operator.close()
        for kind in ("validatingwebhookconfiguration", "mutatingwebhookconfiguration"):
            kube_cluster.kubectl("delete", kind, managed, "--ignore-not-found", check=False)


def _wait_until_serving(cluster: KubeCluster, operator: WebhookOperator) -> None:
    """Until the managed configurations point at the server and it answers (a refusal is its answer)."""
    cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "webhook-probe"}})
    # Slurm enforces no rule natively: a restart rule is refused, which only the webhook says.
    probe = builders.dispatch_job(
        "probe",
        backend="slurm",
        recovery={"rules": [{"on": ["preempted", "node-lost"], "action": "restart", "budget": 5}]},
    )
    deadline = time.monotonic() + 120
    last = ""
    while time.monotonic() < deadline:
        if operator.error is not None:
            raise operator.error
        try:
            cluster.kubectl(
                "apply", "-n", "webhook-probe", "-f", "-", "--dry-run=server", input=yaml.safe_dump(probe)
            )
            last = "the probe was admitted"
        except KubectlError as error:
            last = error.stderr
            if "denied the request" in last and "rule 0 cannot be enforced" in last:
                return
        time.sleep(0.5)
    raise AssertionError(f"the webhook never started serving: {last}")

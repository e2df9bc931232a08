"""The test lab: a Kubernetes cluster made of the real parts, on loopback, without Docker or a kubelet.

etcd + kube-apiserver (:mod:`tests.support.controlplane`, with an audit log) + kube-scheduler +
kube-controller-manager (every default controller, each under its own ServiceAccount) + kwok
(the nodes and their kubelet, stages in ``tests/support/kwok.yaml``) + Kubeflow's training
operator v1.9.3 (its PyTorchJob controller and validating webhook, under its upstream RBAC, with
the project's own ``main``: ``hack/training-operator-lab/main.go``). Binaries come from
``make bins`` (``hack/build-bins.sh``). Every daemon listens on 127.0.0.1 on a free port, runs in
its own process group and is stopped by PID (see :class:`ControlPlane`).

The failure mechanisms are the real ones: preemption by kube-scheduler (a higher-priority pod and
a full node), NoExecute taint eviction and node-lifecycle (kube-controller-manager), pod GC after a
node is deleted, the Eviction API. Only what a kubelet itself reports is played by kwok: a
container's exit (code and reason), an image that cannot be pulled, a deadline kill, a container
waiting, and the termination of a deleted pod (see docs/testing.md).

Opt-in extras (``Lab(extras=("jobset", "trainer"))``, ``up --with jobset,trainer``, or
:meth:`Lab.start_extras` on a running lab): JobSet v0.11.1 with its JobSet mutating and
validating webhooks registered (its reconciler relies on the defaults the mutating one sets), and
Kubeflow Trainer v2.2.0 (``trainer`` implies ``jobset``) with its CRDs, its webhooks, namespace
``kubeflow-system`` and the ``torch-distributed`` ClusterTrainingRuntime. Both serve their
webhooks on 127.0.0.1 with a cert from the lab's CA. Trainer reads its serving cert from the
hard-coded ``/tmp/k8s-webhook-server/serving-certs``: one Trainer per machine, so the lab takes
that directory under a lock, waits while another live lab holds it, and removes it when it stops.
``kueue``: Kueue v0.17.0 (config ``config.kueue.x-k8s.io/v1beta2``, see :func:`kueue_config`) with
its CRDs, namespace ``kueue-system`` and its internal cert management; the frameworks it manages
follow what the lab runs (batch/job, plus PyTorchJob, JobSet and TrainJob when those run; it is
restarted when a later extra adds one). Its webhooks are not registered: their certificate names
``kueue-webhook-service.kueue-system.svc``, which nothing here resolves, so Kueue admits and evicts
through its reconcilers only (a queue-labelled object must be created suspended, as dispatch does).
Read its objects as ``kueue.x-k8s.io/v1beta2`` (the storage version): other versions go through
the CRD conversion webhook, which fails here for the same reason.

Python use::

    with Lab(tmp_dir) as lab:
        lab.kubeconfig
        lab.preempt_pod("ns", "train-1-master-0")

CLI use (the daemons keep running after the command returns)::

    python -m tests.support.lab up --dir DIR     # writes DIR/kubeconfig, DIR/state.json
    python -m tests.support.lab down --dir DIR   # stops them by PID
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Protocol

import yaml

from tests.support.controlplane import (
    ControlPlane,
    _build_script_env,
    _cert_pem,
    _ExitedEarly,
    _free_port,
    _issue,
    _key_pem,
    _load_ca,
    _pid_alive,
    _pid_runs,
    _write,
    detached_cli,
    resolve_binaries,
)

HERE = Path(__file__).resolve().parent
KWOK_CONFIG: Final = HERE / "kwok.yaml"

NODE_PREFIX: Final = "kwok-node-"
NODE_CPU: Final = "32"
NODE_MEMORY: Final = "256Gi"
NODE_GPU: Final = 8
NODE_PODS: Final = "110"
UNPULLABLE_IMAGE: Final = "unpullable.invalid/train:1"
"""Any image under ``unpullable.invalid/`` never pulls (kwok stage ``lab-image-pull-error``)."""
HIGH_PRIORITY: Final = "lab-high"
PREEMPT_ATTEMPTS: Final = 3
"""Preemptors tried for one victim (one bound beside it is deleted and made again: see preempt_pod)."""
LOW_PRIORITY: Final = "lab-low"
TAINT_KEY: Final = "lab.dispatch.io/down"
KWOK_NODE_LABEL: Final = "kwok.x-k8s.io/node"
TRAINING_OPERATOR_NAMESPACE: Final = "kubeflow"
TRAINING_OPERATOR_SA: Final = "training-operator"
WEBHOOK_NAME: Final = "validator.training-operator.kubeflow.org"
WRITE_VERBS: Final = frozenset({"create", "update", "patch", "delete", "deletecollection"})
EXTRAS: Final = ("jobset", "trainer", "kueue")
TRAINER_NAMESPACE: Final = "kubeflow-system"
"""Trainer's namespace: read from the in-Pod ServiceAccount file, else this default (no flag)."""
TRAINER_CERT_DIR: Final = Path("/tmp/k8s-webhook-server/serving-certs")
"""Hard-coded in trainer's pkg/util/cert/cert.go (and controller-runtime's default)."""
TRAINER_RUNTIME: Final = "torch-distributed"
JOBSET_WEBHOOKS: Final = ("jobset-mutating-webhook-configuration", "jobset-validating-webhook-configuration")
TRAINER_WEBHOOKS: Final = (
    "trainer-mutating-webhook-configuration",
    "trainer-validating-webhook-configuration",
)

KUEUE_NAMESPACE: Final = "kueue-system"
KUEUE_SECRET: Final = "kueue-webhook-server-cert"
"""The Secret Kueue's cert rotator fills; the lab copies it into the lab's own cert dir (as the
kubelet's Secret volume would: the rotator waits for the files there)."""
KUEUE_CONVERSION_CRDS: Final = ("localqueues", "clusterqueues", "cohorts", "workloads", "multikueueclusters")
"""The CRDs whose conversion webhook the rotator injects its CA into (pkg/util/cert/cert.go); the
base CRDs have none, and without the field the rotator never gets ready."""
KUEUE_PODS_READY_TIMEOUT: Final = "30s"
"""waitForPodsReady.timeout: short, so a PodsReadyTimeout eviction shows within a test (kwok's
pods are Ready about a second after binding, so a healthy workload is far from it)."""
KUEUE_FRAMEWORKS: Final = {
    "pytorchjob": "kubeflow.org/pytorchjob",
    "jobset": "jobset.x-k8s.io/jobset",
    "trainer": "trainer.kubeflow.org/trainjob",
}

# Faster than the defaults so that node loss shows within seconds (tests wait, never assert time).
KCM_NODE_FLAGS: Final = ("--node-monitor-period=1s", "--node-monitor-grace-period=12s")
APISERVER_TOLERATION_FLAGS: Final = (
    "--default-not-ready-toleration-seconds=5",
    "--default-unreachable-toleration-seconds=5",
)

AUDIT_POLICY: Final = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "None", "verbs": ["get", "list", "watch"]},
        {"level": "Metadata"},
    ],
}


class LabError(RuntimeError):
    """The lab could not start, or a failure mechanism did not take effect."""


class Kubectl(Protocol):
    """kubectl against one cluster (the lab's, the tests' ``KubeCluster``, hack/'s recorders'):
    its arguments in, its stdout out; ``check=False`` returns instead of raising on an error."""

    def __call__(self, *args: str, check: bool = ...) -> str: ...


def wait_established(kubectl: Kubectl, crds: Iterable[str], timeout: float = 60.0) -> None:
    """Until each CRD (``plural.group``) is Established. Polled: ``kubectl wait`` fails at once
    on a CRD just created, whose status has no conditions yet ("expected []interface{}")."""
    deadline = time.monotonic() + timeout
    path = '{.status.conditions[?(@.type=="Established")].status}'
    for crd in crds:
        while kubectl("get", "crd", crd, f"-o=jsonpath={path}", check=False).strip() != "True":
            if time.monotonic() > deadline:
                raise LabError(f"CRD {crd} not Established in {timeout:.0f}s")
            time.sleep(0.2)


@dataclass(frozen=True)
class LabBinaries:
    kube_scheduler: str
    kube_controller_manager: str
    kwok: str
    training_operator: str
    training_operator_manifests: Path
    jobset: str = ""
    jobset_manifests: Path = Path()
    trainer: str = ""
    trainer_manifests: Path = Path()
    kueue: str = ""
    kueue_manifests: Path = Path()


def _extras(names: Sequence[str]) -> tuple[str, ...]:
    """The extras asked for, checked, in start order (Trainer runs its TrainJobs on JobSet)."""
    unknown = sorted(set(names) - set(EXTRAS))
    if unknown:
        raise LabError(f"unknown lab extra(s) {unknown}; known: {list(EXTRAS)}")
    wanted = set(names) | ({"jobset"} if "trainer" in names else set())
    return tuple(e for e in EXTRAS if e in wanted)


def resolve_lab_binaries(*, training_operator: bool = True, extras: Sequence[str] = ()) -> LabBinaries:
    """Find the lab's binaries (env vars first, then the paths ``hack/build-bins.sh`` prints)."""
    keys: tuple[str, ...] = ("DISPATCH_KUBE_SCHEDULER", "DISPATCH_KUBE_CONTROLLER_MANAGER", "DISPATCH_KWOK")
    if training_operator:
        keys += ("DISPATCH_TRAINING_OPERATOR", "DISPATCH_TRAINING_OPERATOR_MANIFESTS")
    for extra in _extras(extras):
        keys += (f"DISPATCH_{extra.upper()}", f"DISPATCH_{extra.upper()}_MANIFESTS")
    found = {k: os.environ.get(k, "") for k in keys}
    if not all(found.values()):
        script = _build_script_env()
        for k in keys:
            found[k] = found[k] or script.get(k, "")
    missing = [
        f"{k}={v or '?'}"
        for k, v in found.items()
        if not v or not (Path(v).is_dir() if k.endswith("MANIFESTS") else os.access(v, os.X_OK))
    ]
    if missing:
        raise LabError("lab binaries not found: " + ", ".join(missing) + " (run `make bins`)")
    return LabBinaries(
        kube_scheduler=found["DISPATCH_KUBE_SCHEDULER"],
        kube_controller_manager=found["DISPATCH_KUBE_CONTROLLER_MANAGER"],
        kwok=found["DISPATCH_KWOK"],
        training_operator=found.get("DISPATCH_TRAINING_OPERATOR", ""),
        training_operator_manifests=Path(found.get("DISPATCH_TRAINING_OPERATOR_MANIFESTS", "")),
        jobset=found.get("DISPATCH_JOBSET", ""),
        jobset_manifests=Path(found.get("DISPATCH_JOBSET_MANIFESTS", "")),
        trainer=found.get("DISPATCH_TRAINER", ""),
        trainer_manifests=Path(found.get("DISPATCH_TRAINER_MANIFESTS", "")),
        kueue=found.get("DISPATCH_KUEUE", ""),
        kueue_manifests=Path(found.get("DISPATCH_KUEUE_MANIFESTS", "")),
    )


def kueue_config(
    *,
    ports: Mapping[str, int],
    cert_dir: Path,
    frameworks: Sequence[str],
    pods_ready_timeout: str = KUEUE_PODS_READY_TIMEOUT,
) -> dict[str, Any]:
    """Kueue's configuration for the lab: everything on loopback, the cert dir the lab's own (not
    a machine-global path), only queue-labelled objects managed, and waitForPodsReady with a short
    timeout and a short requeue backoff (Kueue's own requeue, which dispatch must stop)."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": KUEUE_NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{ports['probe']}"},
        "metrics": {"bindAddress": f"127.0.0.1:{ports['metrics']}"},
        "webhook": {"port": ports["webhook"], "host": "127.0.0.1", "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        # Off, the metrics cert path is hard-coded to /etc/kueue/metrics/certs (cmd/kueue/main.go).
        "internalCertManagement": {"enable": True},
        "manageJobsWithoutQueueName": False,
        "waitForPodsReady": {
            "timeout": pods_ready_timeout,
            "blockAdmission": False,
            "requeuingStrategy": {"timestamp": "Eviction", "backoffBaseSeconds": 5, "backoffMaxSeconds": 30},
        },
        "integrations": {"frameworks": ["batch/job", *frameworks]},
    }


def node_manifest(
    name: str,
    *,
    cpu: str = NODE_CPU,
    memory: str = NODE_MEMORY,
    gpu: int = NODE_GPU,
    pods: str = NODE_PODS,
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A Node that kwok manages (its label), with the capacity a GPU node would report."""
    resources = {"cpu": cpu, "memory": memory, "pods": pods, "nvidia.com/gpu": str(gpu)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                KWOK_NODE_LABEL: "fake",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                **(labels or {}),
            },
        },
        "status": {"allocatable": resources, "capacity": resources},
    }


class Lab:
    """The whole lab. ``start()``/``stop()`` or a context manager; see the module docstring."""

    def __init__(
        self,
        workdir: Path | str,
        *,
        nodes: int = 3,
        start_timeout: float = 120.0,
        training_operator: bool = True,
        extras: Sequence[str] = (),
    ) -> None:
        self.dir = Path(workdir).resolve()
        self.node_count = nodes
        self.start_timeout = start_timeout
        self.with_training_operator = training_operator
        self.extras = _extras(extras)
        self.extras_seconds: dict[str, float] = {}
        self._trainer_lock: Any = None
        self.audit_log = self.dir / "audit.log"
        self.cp = ControlPlane(
            self.dir,
            start_timeout=start_timeout,
            extra_apiserver_args=[
                f"--audit-policy-file={self.dir / 'audit-policy.yaml'}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-maxsize=1024",
                "--audit-log-format=json",
                *APISERVER_TOLERATION_FLAGS,
            ],
        )
        self.bins: LabBinaries | None = None
        self.start_seconds = 0.0
        self.ports: dict[str, int] = {}
        self._to_kubeconfig: Path | None = None
        self._ssl: Any = None

    # ---- lifecycle -----------------------------------------------------------------

    @property
    def kubeconfig(self) -> Path:
        return self.cp.kubeconfig

    @property
    def server(self) -> str:
        return self.cp.server

    @property
    def kubectl_bin(self) -> str:
        assert self.cp.binaries is not None
        return self.cp.binaries.kubectl

    @property
    def nodes(self) -> list[str]:
        return [f"{NODE_PREFIX}{i}" for i in range(self.node_count)]

    def __enter__(self) -> Lab:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def control_plane(self) -> ControlPlane:
        return self.cp

    def start(self, *, detach: bool = False) -> None:
        """Start everything and wait until each part is ready (nodes Ready, webhook serving)."""
        t0 = time.monotonic()
        self.bins = resolve_lab_binaries(training_operator=self.with_training_operator, extras=self.extras)
        self.cp.binaries = self.cp.binaries or resolve_binaries()
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "audit-policy.yaml").write_text(yaml.safe_dump(AUDIT_POLICY))
        self.audit_log.unlink(missing_ok=True)
        try:
            self.cp.start(detach=detach)
            self._start_components(detach=detach)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - t0
        self._write_lab_state()

    def stop(self) -> None:
        """Stop every process (components first, then the apiserver and etcd) by PID."""
        try:
            self.cp.stop()
        finally:
            self._release_trainer_cert_dir()

    def _start_components(self, *, detach: bool) -> None:
        assert self.bins is not None
        cp = self.cp
        deadline = time.monotonic() + self.start_timeout
        sched_port, kcm_port = _free_port(), _free_port()
        self.ports.update(kube_scheduler=sched_port, kube_controller_manager=kcm_port)
        sched_kubeconfig = cp.mint_user("system:kube-scheduler")
        kcm_kubeconfig = cp.mint_user("system:kube-controller-manager")

        def scheduler_args(port: int) -> list[str]:
            return [
                f"--kubeconfig={sched_kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.dir / 'kube-scheduler'}",
                "--leader-elect=false",
            ]

        def kcm_args(port: int) -> list[str]:
            return [
                f"--kubeconfig={kcm_kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.dir / 'kube-controller-manager'}",
                "--leader-elect=false",
                # Each controller under its own ServiceAccount and bootstrap role, as in a cluster.
                "--use-service-account-credentials=true",
                "--controllers=*",
                f"--service-account-private-key-file={cp.pki / 'sa.key'}",
                f"--root-ca-file={cp.pki / 'server-ca.crt'}",
                *KCM_NODE_FLAGS,
            ]

        scheduler = cp.spawn(
            "kube-scheduler", self.bins.kube_scheduler, scheduler_args(sched_port), detach=detach
        )
        kcm = cp.spawn(
            "kube-controller-manager", self.bins.kube_controller_manager, kcm_args(kcm_port), detach=detach
        )
        kwok = cp.spawn(
            "kwok",
            self.bins.kwok,
            [
                f"--kubeconfig={cp.mint_user('kwok-controller', ['system:masters'])}",
                f"--config={KWOK_CONFIG}",
            ],
            detach=detach,
        )
        self.kubectl("create", "-f", "-", input=self._bootstrap_manifests())
        self._wait_or_respawn(scheduler, "kube_scheduler", scheduler_args, detach=detach)
        self._wait_or_respawn(kcm, "kube_controller_manager", kcm_args, detach=detach)
        if self.with_training_operator:
            self.start_training_operator(detach=detach)
        self.start_extras(self.extras, detach=detach)
        while True:
            ready = self._ready_nodes()
            if all(n in ready for n in self.nodes):
                break
            if kwok.popen is not None and kwok.popen.poll() is not None:
                raise LabError(f"kwok exited; log {kwok.log}")
            if time.monotonic() > deadline:
                raise LabError(f"kwok nodes not Ready ({sorted(ready)}); log {kwok.log}")
            time.sleep(0.2)

    def _wait_or_respawn(
        self, proc: Any, port_key: str, make_args: Any, *, detach: bool, attempts: int = 3
    ) -> None:
        """Wait for /healthz; a daemon that exits at start (its free port was taken meanwhile by
        another process on the machine) is started again on a new port."""
        for attempt in range(1, attempts + 1):
            try:
                self.cp.wait_http(proc, f"https://127.0.0.1:{self.ports[port_key]}/healthz")
                return
            except _ExitedEarly:
                if attempt == attempts:
                    raise
            self.cp._procs.remove(proc)
            self.ports[port_key] = _free_port()
            proc = self.cp.spawn(proc.name, proc.binary, make_args(self.ports[port_key]), detach=detach)

    def _bootstrap_manifests(self) -> str:
        """Nodes, PriorityClasses and the training operator's upstream objects, in one create."""
        assert self.bins is not None
        docs: list[dict[str, Any]] = [node_manifest(n) for n in self.nodes]
        docs += [
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": name},
                "value": value,
                "description": "the test lab: preemption by kube-scheduler",
            }
            for name, value in ((HIGH_PRIORITY, 1000000), (LOW_PRIORITY, 100))
        ]
        if self.with_training_operator:
            m = self.bins.training_operator_manifests
            crd = yaml.safe_load((m / "kubeflow.org_pytorchjobs.yaml").read_text())
            role = yaml.safe_load((m / "role.yaml").read_text())
            sa = yaml.safe_load((m / "service-account.yaml").read_text())
            sa["metadata"]["namespace"] = TRAINING_OPERATOR_NAMESPACE
            docs += [
                crd,
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": TRAINING_OPERATOR_NAMESPACE}},
                # As manifests/overlays/standalone's secretGenerator: the cert rotator fills it.
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {
                        "name": "training-operator-webhook-cert",
                        "namespace": TRAINING_OPERATOR_NAMESPACE,
                    },
                },
                role,
                sa,
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "ClusterRoleBinding",
                    "metadata": {"name": "training-operator"},
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "ClusterRole",
                        "name": role["metadata"]["name"],
                    },
                    "subjects": [
                        {
                            "kind": "ServiceAccount",
                            "name": TRAINING_OPERATOR_SA,
                            "namespace": TRAINING_OPERATOR_NAMESPACE,
                        }
                    ],
                },
                self._webhook_configuration(m),
            ]
        return yaml.safe_dump_all(docs, sort_keys=False)

    def _webhook_configuration(self, manifests: Path) -> dict[str, Any]:
        """Upstream's pytorchjob entry of manifests/base/webhook/manifests.yaml, with a URL on
        loopback instead of the Service (no Service DNS here); the rotator injects the CA."""
        port = self.ports.setdefault("training_operator_webhook", _free_port())
        upstream = yaml.safe_load((manifests / "manifests.yaml").read_text())
        entry = next(w for w in upstream["webhooks"] if "pytorchjob" in w["name"])
        path = entry["clientConfig"]["service"]["path"]
        entry["clientConfig"] = {"url": f"https://localhost:{port}{path}"}
        entry["failurePolicy"] = "Fail"
        return {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": WEBHOOK_NAME},
            "webhooks": [entry],
        }

    # ---- the training operator -----------------------------------------------------

    def start_training_operator(self, *, detach: bool = False) -> None:
        """Start (or restart) the training operator and wait for /readyz (certs and webhook up)."""
        assert self.bins is not None
        if self.training_operator_running():
            return
        if self._to_kubeconfig is None:
            self._to_kubeconfig = self.cp.serviceaccount_kubeconfig(
                TRAINING_OPERATOR_NAMESPACE, TRAINING_OPERATOR_SA
            )
        for attempt in range(1, 4):
            webhook = self.ports.setdefault("training_operator_webhook", _free_port())
            probe, metrics = _free_port(), _free_port()
            self.ports.update(training_operator_probe=probe, training_operator_metrics=metrics)
            self.cp._procs = [p for p in self.cp._procs if p.name != "training-operator"]
            proc = self.cp.spawn(
                "training-operator",
                self.bins.training_operator,
                [
                    "--enable-scheme=pytorchjob",
                    f"--metrics-bind-address=127.0.0.1:{metrics}",
                    f"--health-probe-bind-address=127.0.0.1:{probe}",
                    "--webhook-host=127.0.0.1",
                    f"--webhook-server-port={webhook}",
                    f"--webhook-cert-dir={self.dir / 'training-operator' / 'certs'}",
                ],
                detach=detach,
                env={"MY_POD_NAMESPACE": TRAINING_OPERATOR_NAMESPACE, "KUBECONFIG": str(self._to_kubeconfig)},
            )
            try:
                self.cp.wait_http(proc, f"http://127.0.0.1:{probe}/readyz")
                return
            except _ExitedEarly:  # one of its free ports was taken meanwhile: new ports, new URL
                if attempt == 3:
                    raise
            del self.ports["training_operator_webhook"]
            vwc = self._webhook_configuration(self.bins.training_operator_manifests)
            self.request(
                "PATCH",
                f"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{WEBHOOK_NAME}",
                {"webhooks": vwc["webhooks"]},
                content_type="application/merge-patch+json",
            )

    def _training_operator_proc(self) -> Any:
        return next((p for p in self.cp._procs if p.name == "training-operator"), None)

    def training_operator_running(self) -> bool:
        proc = self._training_operator_proc()
        if proc is None:
            return False
        if proc.popen is not None:
            return bool(proc.popen.poll() is None)
        return _pid_runs(proc.pid, proc.binary)

    def stop_training_operator(self, *, kill: bool = False) -> None:
        """SIGTERM (or SIGKILL) the training operator and wait for it to exit."""
        import signal

        proc = self._training_operator_proc()
        if proc is None or not self.training_operator_running():
            return
        os.kill(proc.pid, signal.SIGKILL if kill else signal.SIGTERM)
        deadline = time.monotonic() + 30
        while self.training_operator_running():
            if time.monotonic() > deadline:
                os.kill(proc.pid, signal.SIGKILL)
            time.sleep(0.05)

    # ---- the extras: JobSet and Kubeflow Trainer v2 ----------------------------------

    def start_extras(self, names: Sequence[str], *, detach: bool = False) -> None:
        """Start the extras not yet running (``jobset``, ``trainer``; trainer implies jobset) and
        wait until each serves its webhooks; callable on a running lab (the ``lab_extras``
        fixture). Their start-up seconds go to ``extras_seconds`` and the state file."""
        wanted = _extras(names)
        if not wanted:
            return
        assert self.bins is not None
        if any(not getattr(self.bins, e) for e in wanted):
            self.bins = resolve_lab_binaries(
                training_operator=self.with_training_operator, extras=(*self.extras, *wanted)
            )
        started: list[str] = []
        for extra in wanted:
            if self._extra_running(extra):
                continue
            t0 = time.monotonic()
            if extra == "jobset":
                self._start_jobset(detach=detach)
            elif extra == "trainer":
                self._start_trainer(detach=detach)
            else:
                self._start_kueue(detach=detach)
            started.append(extra)
            self.extras_seconds[extra] = round(time.monotonic() - t0, 2)
        if "kueue" not in started and self._extra_running("kueue") and set(started) & set(KUEUE_FRAMEWORKS):
            # Kueue sets up a framework whose CRD came later only after a backoff of minutes.
            self.restart_kueue(detach=detach)
        self.extras = _extras((*self.extras, *wanted))
        if self.cp.state_file.exists():
            self._write_lab_state()

    def _extra_running(self, name: str) -> bool:
        proc = next((p for p in self.cp._procs if p.name == name), None)
        if proc is None:
            return False
        if proc.popen is not None:
            return bool(proc.popen.poll() is None)
        return _pid_runs(proc.pid, proc.binary)

    def _serving_cert(self, directory: Path) -> tuple[Path, str]:
        """tls.crt/tls.key for ``localhost`` and 127.0.0.1 from the lab's server CA (the one the
        apiserver's webhook calls verify against, as caBundle); returns the dir and the bundle."""
        ca_key, ca_cert = _load_ca(self.cp.pki, "server-ca")
        key, cert = _issue(
            ca_key,
            ca_cert,
            common_name="lab-webhook",
            server=True,
            dns_names=["localhost"],
            ips=["127.0.0.1"],
        )
        directory.mkdir(parents=True, exist_ok=True)
        _write(directory / "tls.crt", _cert_pem(cert), 0o644)
        _write(directory / "tls.key", _key_pem(key))
        return directory, base64.b64encode((self.cp.pki / "server-ca.crt").read_bytes()).decode()

    def _webhooks_on_loopback(
        self, manifest: Path, names: Sequence[str], port: int, ca_bundle: str, resources: set[str]
    ) -> list[dict[str, Any]]:
        """Upstream's webhook configurations with a loopback URL instead of the Service (no
        Service DNS here), keeping only the webhooks for RESOURCES (JobSet's pod webhooks would
        apply to every pod in the lab), renamed NAMES (mutating, validating)."""
        out: list[dict[str, Any]] = []
        for doc in yaml.safe_load_all(manifest.read_text()):
            if not doc:
                continue
            hooks = []
            for hook in doc.get("webhooks") or ():
                if (
                    not {r for rule in hook.get("rules") or () for r in rule.get("resources") or ()}
                    & resources
                ):
                    continue
                path = hook["clientConfig"]["service"]["path"]
                hook["clientConfig"] = {"url": f"https://localhost:{port}{path}", "caBundle": ca_bundle}
                hooks.append(hook)
            name = names[0] if doc["kind"] == "MutatingWebhookConfiguration" else names[1]
            out.append(
                {
                    "apiVersion": doc["apiVersion"],
                    "kind": doc["kind"],
                    "metadata": {"name": name},
                    "webhooks": hooks,
                }
            )
        return out

    def _spawn_ready(
        self, name: str, binary: str, make_args: Any, *, detach: bool, env: dict[str, str] | None = None
    ) -> dict[str, int]:
        """Spawn a controller-runtime manager on fresh loopback ports (probe, metrics, webhook)
        and wait for /readyz; a port taken meanwhile by another process means new ports."""
        for attempt in range(1, 4):
            ports = {"probe": _free_port(), "metrics": _free_port(), "webhook": _free_port()}
            self.cp._procs = [p for p in self.cp._procs if p.name != name]
            user = self.cp.mint_user(f"lab-{name}", ["system:masters"])
            proc = self.cp.spawn(name, binary, make_args(ports, user), detach=detach, env=env)
            try:
                self.cp.wait_http(proc, f"http://127.0.0.1:{ports['probe']}/readyz")
            except _ExitedEarly:
                if attempt == 3:
                    raise
                continue
            self.ports.update({f"{name}_{k}": v for k, v in ports.items()})
            return ports
        raise AssertionError("unreachable")

    def _start_jobset(self, *, detach: bool) -> None:
        assert self.bins is not None
        m = self.bins.jobset_manifests
        self.kubectl(
            "apply", "--server-side", "--force-conflicts", "-f", str(m / "jobset.x-k8s.io_jobsets.yaml")
        )
        self._wait_established("jobsets")
        certs, ca_bundle = self._serving_cert(self.dir / "jobset" / "certs")
        config = self.dir / "jobset" / "config.yaml"

        def args(ports: dict[str, int], user: Path) -> list[str]:
            # internalCertManagement off: its cert dir would be the machine-global one; certDir is ours.
            config.write_text(
                yaml.safe_dump(
                    {
                        "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
                        "kind": "Configuration",
                        "health": {"healthProbeBindAddress": f"127.0.0.1:{ports['probe']}"},
                        "metrics": {"bindAddress": f"127.0.0.1:{ports['metrics']}"},
                        "webhook": {"port": ports["webhook"], "host": "127.0.0.1", "certDir": str(certs)},
                        "leaderElection": {"leaderElect": False},
                        "internalCertManagement": {"enable": False},
                    }
                )
            )
            return [
                f"--kubeconfig={user}",
                f"--config={config}",
                f"--metrics-bind-address=127.0.0.1:{ports['metrics']}",
            ]

        ports = self._spawn_ready("jobset", self.bins.jobset, args, detach=detach)
        # Without the mutating webhook's defaults (spec.network) the reconciler panics on every
        # JobSet (dnsHostnamesEnabled, pkg/controllers/jobset_controller.go).
        hooks = self._webhooks_on_loopback(
            m / "webhook-manifests.yaml", JOBSET_WEBHOOKS, ports["webhook"], ca_bundle, {"jobsets"}
        )
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(hooks, sort_keys=False))

    def _wait_established(self, *plurals: str) -> None:
        group = {"jobsets": "jobset.x-k8s.io"}
        names = (p if "." in p else f"{p}.{group.get(p, 'trainer.kubeflow.org')}" for p in plurals)
        wait_established(self.kubectl, names)

    def _start_trainer(self, *, detach: bool) -> None:
        assert self.bins is not None
        m = self.bins.trainer_manifests
        for crd in sorted(m.glob("trainer.kubeflow.org_*.yaml")):
            self.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd))
        # It exits at start when a kind is not served yet ("no matches for kind TrainJob").
        self._wait_established("trainjobs", "trainingruntimes", "clustertrainingruntimes")
        self.kubectl(
            "apply",
            "-f",
            "-",
            input=yaml.safe_dump(
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": TRAINER_NAMESPACE}}
            ),
        )
        self._take_trainer_cert_dir()
        _, ca_bundle = self._serving_cert(TRAINER_CERT_DIR)
        config = self.dir / "trainer" / "config.yaml"
        config.parent.mkdir(parents=True, exist_ok=True)

        def args(ports: dict[str, int], user: Path) -> list[str]:
            # certManagement off: the serving cert is the lab CA's, in the hard-coded dir.
            config.write_text(
                yaml.safe_dump(
                    {
                        "apiVersion": "config.trainer.kubeflow.org/v1alpha1",
                        "kind": "Configuration",
                        "health": {"healthProbeBindAddress": f"127.0.0.1:{ports['probe']}"},
                        "metrics": {"bindAddress": f"127.0.0.1:{ports['metrics']}", "secureServing": True},
                        "webhook": {"port": ports["webhook"], "host": "127.0.0.1"},
                        "leaderElection": {"leaderElect": False},
                        "certManagement": {"enable": False},
                    }
                )
            )
            return [f"--kubeconfig={user}", f"--config={config}"]

        ports = self._spawn_ready("trainer", self.bins.trainer, args, detach=detach)
        self._note_trainer_pid()
        hooks = self._webhooks_on_loopback(
            m / "webhook-manifests.yaml",
            TRAINER_WEBHOOKS,
            ports["webhook"],
            ca_bundle,
            {"trainjobs", "trainingruntimes", "clustertrainingruntimes"},
        )
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(hooks, sort_keys=False))
        # Through the validating webhook just registered (the apiserver may still miss it).
        deadline = time.monotonic() + 60
        while True:
            try:
                self.kubectl("apply", "-f", str(m / "torch_distributed.yaml"))
                return
            except LabError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def _kueue_frameworks(self) -> list[str]:
        running = {"pytorchjob"} if self.with_training_operator else set()
        running |= {e for e in ("jobset", "trainer") if self._extra_running(e)}
        return [fw for key, fw in KUEUE_FRAMEWORKS.items() if key in running]

    def _start_kueue(self, *, detach: bool) -> None:
        assert self.bins is not None
        m = self.bins.kueue_manifests
        for crd in sorted(m.glob("kueue.x-k8s.io_*.yaml")):
            self.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd))
        self._wait_established(*(f"{c}.kueue.x-k8s.io" for c in KUEUE_CONVERSION_CRDS))
        self.kubectl(
            "apply",
            "-f",
            "-",
            input=yaml.safe_dump_all(
                [
                    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KUEUE_NAMESPACE}},
                    {
                        "apiVersion": "v1",
                        "kind": "Secret",
                        "metadata": {"name": KUEUE_SECRET, "namespace": KUEUE_NAMESPACE},
                    },
                ]
            ),
        )
        self._start_kueue_process(detach=detach)

    def _start_kueue_process(self, *, detach: bool) -> None:
        assert self.bins is not None
        certs = self.dir / "kueue" / "certs"
        config = self.dir / "kueue" / "config.yaml"
        config.parent.mkdir(parents=True, exist_ok=True)
        frameworks = self._kueue_frameworks()

        def args(ports: dict[str, int], user: Path) -> list[str]:
            for crd in KUEUE_CONVERSION_CRDS:
                conversion = {
                    "strategy": "Webhook",
                    "webhook": {
                        "clientConfig": {"url": f"https://localhost:{ports['webhook']}/convert"},
                        "conversionReviewVersions": ["v1"],
                    },
                }
                self.request(
                    "PATCH",
                    f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}.kueue.x-k8s.io",
                    {"spec": {"conversion": conversion}},
                    content_type="application/merge-patch+json",
                )
            body = kueue_config(ports=ports, cert_dir=certs, frameworks=frameworks)
            config.write_text(yaml.safe_dump(body))
            # --kubeconfig as a flag: the visibility server reads the flag, not $KUBECONFIG. That
            # server is off: it writes self-signed certs to a hard-coded /visibility at the
            # filesystem root (pkg/visibility/server.go), and the lab writes nothing outside its dir.
            return [f"--kubeconfig={user}", f"--config={config}", "--feature-gates=VisibilityOnDemand=false"]

        stop = threading.Event()
        copier = threading.Thread(target=self._copy_kueue_certs, args=(certs, stop), daemon=True)
        copier.start()
        try:
            self._spawn_ready(
                "kueue", self.bins.kueue, args, detach=detach, env={"POD_NAMESPACE": KUEUE_NAMESPACE}
            )
        finally:
            stop.set()
            copier.join(timeout=10)

    def _copy_kueue_certs(self, certs: Path, stop: threading.Event) -> None:
        """Copy the rotator's Secret into the cert dir once it is filled (its kubelet volume). Once
        is enough: the rotator only waits for the files, and it renews years later."""
        path = f"/api/v1/namespaces/{KUEUE_NAMESPACE}/secrets/{KUEUE_SECRET}"
        while not stop.is_set():
            try:
                data = self.request("GET", path).get("data") or {}
            except (ApiStatus, OSError):
                data = {}
            if all(data.get(k) for k in ("tls.crt", "tls.key", "ca.crt")):
                certs.mkdir(parents=True, exist_ok=True)
                for name, value in data.items():
                    _write(certs / name, base64.b64decode(value), 0o600 if name.endswith(".key") else 0o644)
                return
            stop.wait(0.2)

    def kueue_running(self) -> bool:
        return self._extra_running("kueue")

    def stop_kueue(self, *, kill: bool = False) -> None:
        """SIGTERM (or SIGKILL) Kueue and wait for it to exit."""
        import signal

        proc = next((p for p in self.cp._procs if p.name == "kueue"), None)
        if proc is None or not self.kueue_running():
            return
        os.kill(proc.pid, signal.SIGKILL if kill else signal.SIGTERM)
        deadline = time.monotonic() + 30
        while self.kueue_running():
            if time.monotonic() > deadline:
                os.kill(proc.pid, signal.SIGKILL)
            time.sleep(0.05)

    def restart_kueue(self, *, detach: bool = False) -> None:
        """Stop Kueue and start it again (frameworks recomputed from what runs now)."""
        self.stop_kueue()
        t0 = time.monotonic()
        self._start_kueue_process(detach=detach)
        self.extras_seconds["kueue"] = round(time.monotonic() - t0, 2)

    # The machine-global cert dir: mkdir of its parent is the mutex; owner.json names the holder
    # (its lab dir and the pids that keep it: this process until the Trainer runs, then the Trainer).

    def _owner_file(self) -> Path:
        return TRAINER_CERT_DIR.parent / "owner.json"

    def _take_trainer_cert_dir(self) -> None:
        root = TRAINER_CERT_DIR.parent
        deadline = time.monotonic() + self.start_timeout
        while True:
            try:
                root.mkdir()
                break
            except FileExistsError:
                holder = _cert_dir_holder(self._owner_file())
                if holder is None:  # stale: its holder is gone
                    shutil.rmtree(root, ignore_errors=True)
                    continue
                if holder == str(self.dir):
                    shutil.rmtree(TRAINER_CERT_DIR, ignore_errors=True)
                    break
                if time.monotonic() > deadline:
                    raise LabError(
                        f"{TRAINER_CERT_DIR} is held by the lab in {holder} (Trainer v2's hard-coded "
                        "cert dir: one Trainer per machine); stop that lab first"
                    ) from None
                time.sleep(1.0)
        self._write_owner([{"pid": os.getpid(), "binary": ""}])

    def _note_trainer_pid(self) -> None:
        proc = next(p for p in self.cp._procs if p.name == "trainer")
        self._write_owner([{"pid": proc.pid, "binary": proc.binary}])

    def _write_owner(self, pids: list[dict[str, Any]]) -> None:
        tmp = self._owner_file().with_suffix(".tmp")
        tmp.write_text(json.dumps({"lab": str(self.dir), "pids": pids}))
        tmp.replace(self._owner_file())

    def _release_trainer_cert_dir(self) -> None:
        release_trainer_cert_dir(self.dir)

    # ---- API access ----------------------------------------------------------------

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120.0
    ) -> str:
        argv = [self.kubectl_bin, f"--kubeconfig={self.kubeconfig}", *args]
        proc = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise LabError(f"kubectl {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc.stdout

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        query: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """One API request as the admin (no kubectl process); raises ApiStatus on non-2xx."""
        if self._ssl is None:
            self._ssl = self.cp.admin_ssl_context()
        url = self.server + path + (("?" + urllib.parse.urlencode(query)) if query else "")
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": content_type})
        try:
            with urllib.request.urlopen(req, timeout=30, context=self._ssl) as resp:
                out: dict[str, Any] = json.loads(resp.read() or b"{}")
                return out
        except urllib.error.HTTPError as e:
            text = e.read().decode(errors="replace")
            e.close()
            raise ApiStatus(e.code, f"{method} {path}: HTTP {e.code}: {text}") from None

    def mint_user(self, name: str, groups: Sequence[str] = ()) -> Path:
        return self.cp.mint_user(name, groups)

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
        except ApiStatus as e:
            if e.code == 404:
                return None
            raise

    def pods(self, namespace: str, label_selector: str = "") -> list[dict[str, Any]]:
        query = {"labelSelector": label_selector} if label_selector else None
        out = self.request("GET", f"/api/v1/namespaces/{namespace}/pods", query=query)
        return list(out.get("items") or [])

    def node(self, name: str) -> dict[str, Any] | None:
        try:
            return self.request("GET", f"/api/v1/nodes/{name}")
        except ApiStatus as e:
            if e.code == 404:
                return None
            raise

    def _ready_nodes(self) -> set[str]:
        items = self.request("GET", "/api/v1/nodes").get("items") or []
        return {
            n["metadata"]["name"]
            for n in items
            if any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in n.get("status", {}).get("conditions") or ()
            )
        }

    def wait(self, what: str, probe: Any, timeout: float = 90.0, interval: float = 0.1) -> Any:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            last = probe()
            if last:
                return last
            time.sleep(interval)
        raise LabError(f"timed out waiting for {what}; last: {last!r}")

    def pod_node(self, namespace: str, name: str, timeout: float = 60.0) -> str:
        """The node a pod is bound to (waits for the binding)."""

        def bound() -> str:
            pod = self.pod(namespace, name)
            return str((pod or {}).get("spec", {}).get("nodeName") or "")

        return str(self.wait(f"pod {namespace}/{name} bound to a node", bound, timeout))

    def annotate_pod(self, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None:
        self.request(
            "PATCH",
            f"/api/v1/namespaces/{namespace}/pods/{name}",
            {"metadata": {"annotations": dict(annotations)}},
            content_type="application/merge-patch+json",
        )

    # ---- what a kubelet reports (kwok stages) --------------------------------------

    def exit_pod(
        self,
        namespace: str,
        name: str,
        code: int,
        *,
        reason: str | None = None,
        message: str | None = None,
        container: str = "pytorch",
    ) -> None:
        """A container exits with CODE (kwok stage lab-container-exit; see kwok.yaml)."""
        ann = {"lab.dispatch.io/exit-code": str(code), "lab.dispatch.io/exit-container": container}
        if reason:
            ann["lab.dispatch.io/exit-reason"] = reason
        if message:
            ann["lab.dispatch.io/exit-message"] = message
        self._wait_running(namespace, name)
        self.annotate_pod(namespace, name, ann)

    def deadline_pod(self, namespace: str, name: str) -> None:
        """The kubelet's activeDeadlineSeconds kill: Failed, reason DeadlineExceeded."""
        self.annotate_pod(namespace, name, {"lab.dispatch.io/deadline": "true"})

    def shutdown_pod(self, namespace: str, name: str) -> None:
        """The kubelet's graceful node shutdown: Failed, DisruptionTarget TerminationByKubelet."""
        self.annotate_pod(namespace, name, {"lab.dispatch.io/node-shutdown": "true"})

    def waiting_pod(
        self, namespace: str, name: str, reason: str, message: str = "", container: str = "pytorch"
    ) -> None:
        """The container goes waiting with REASON (e.g. CreateContainerConfigError)."""
        self.annotate_pod(
            namespace,
            name,
            {
                "lab.dispatch.io/waiting-reason": reason,
                "lab.dispatch.io/waiting-message": message,
                "lab.dispatch.io/waiting-container": container,
            },
        )

    def _wait_running(self, namespace: str, name: str) -> None:
        def running() -> bool:
            pod = self.pod(namespace, name)
            return bool(pod and pod.get("status", {}).get("phase") == "Running")

        self.wait(f"pod {namespace}/{name} Running", running, 60)

    # ---- what the control plane does (real mechanisms) -----------------------------

    def preempt_pod(
        self,
        namespace: str,
        name: str,
        *,
        keep: bool = False,
        whole_node: bool = False,
        timeout: float = 60.0,
    ) -> str:
        """Real preemption by kube-scheduler: a ``lab-high`` pod for the victim's node that needs
        the victim's cpu and refuses to share the node with it (required pod anti-affinity on a
        label put on the victim). The scheduler's smallest set of victims is then exactly that
        pod, whatever else runs or arrives on the node meanwhile (so concurrent preemptions never
        take a neighbour). With ``whole_node`` the preemptor asks for the node's whole cpu (a full
        node) and every lower-priority pod there goes.
        Returns the preemptor's name; unless ``keep``, it is deleted once it is bound."""
        node_name = self.pod_node(namespace, name)
        node = self.node(node_name)
        victim = self.pod(namespace, name)
        if node is None or victim is None:
            raise LabError(f"pod {namespace}/{name} or its node {node_name} does not exist")
        uid = victim["metadata"]["uid"]
        token = secrets.token_hex(3)
        spec: dict[str, Any] = {
            "priorityClassName": HIGH_PRIORITY,
            "nodeSelector": {"kubernetes.io/hostname": node_name},
            "terminationGracePeriodSeconds": 0,
        }
        if whole_node:
            cpu = node["status"]["allocatable"]["cpu"]
        else:
            self.request(
                "PATCH",
                f"/api/v1/namespaces/{namespace}/pods/{name}",
                {"metadata": {"labels": {"lab.dispatch.io/victim": token}}},
                content_type="application/merge-patch+json",
            )
            cpu = f"{max(_millicpu(_pod_cpu(victim)), 1)}m"
            spec["affinity"] = {
                "podAntiAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "labelSelector": {"matchLabels": {"lab.dispatch.io/victim": token}},
                            "topologyKey": "kubernetes.io/hostname",
                        }
                    ]
                }
            }
        spec["containers"] = [
            {"name": "hog", "image": "lab.invalid/hog:1", "resources": {"requests": {"cpu": cpu}}}
        ]

        def disrupted() -> bool:
            pod = self.pod(namespace, name)
            if pod is None or pod["metadata"]["uid"] != uid:
                return True
            return any(
                c.get("type") == "DisruptionTarget" and c.get("status") == "True"
                for c in pod.get("status", {}).get("conditions") or ()
            )

        def bound(pod_name: str) -> bool:
            return bool((self.pod(namespace, pod_name) or {}).get("spec", {}).get("nodeName"))

        def preempts(preemptor: str) -> bool:
            """Create ``preemptor``; True once the victim is disrupted, False when the preemptor
            was bound beside it (then deleted again)."""
            self.request(
                "POST",
                f"/api/v1/namespaces/{namespace}/pods",
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": preemptor, "labels": {"lab.dispatch.io/preemptor": "true"}},
                    "spec": spec,
                },
            )
            try:
                # A preemptor is bound only once its victims are gone, so bound while the victim
                # stays undisrupted means kube-scheduler found room beside it: its cache did not
                # have the victim's new label yet (the anti-affinity could not hold).
                self.wait(
                    f"preemption of {namespace}/{name} on {node_name}",
                    lambda: disrupted() or bound(preemptor),
                    timeout,
                )
                if disrupted():
                    if not keep:
                        self.wait(f"preemptor {preemptor} bound", lambda: bound(preemptor), timeout)
                    return True
            except LabError as e:
                raise LabError(f"{e}; preemptor: {self.pod(namespace, preemptor)}") from None
            self.delete_pod(namespace, preemptor, grace_seconds=0)
            self.wait(f"preemptor {preemptor} gone", lambda: self.pod(namespace, preemptor) is None, timeout)
            return False

        for attempt in range(1, PREEMPT_ATTEMPTS + 1):
            preemptor = f"lab-preemptor-{token}-{attempt}"
            if preempts(preemptor):
                break
        else:
            raise LabError(f"{PREEMPT_ATTEMPTS} preemptors of {namespace}/{name} were bound beside it")
        if not keep:
            self.delete_pod(namespace, preemptor, grace_seconds=0)
        return preemptor

    def evict_pod(self, namespace: str, name: str) -> None:
        """The Eviction API (what ``kubectl drain`` uses): DisruptionTarget EvictionByEvictionAPI."""
        self.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/pods/{name}/eviction",
            {
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": name, "namespace": namespace},
            },
        )

    def delete_pod(self, namespace: str, name: str, *, grace_seconds: int | None = None) -> None:
        query = {"gracePeriodSeconds": str(grace_seconds)} if grace_seconds is not None else None
        with contextlib.suppress(ApiStatus):
            self.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", query=query)

    def _patch_node(self, name: str, change: Any) -> None:
        for _ in range(20):
            node = self.node(name)
            if node is None:
                raise LabError(f"node {name} does not exist")
            patch = change(node)
            if patch is None:
                return
            patch.setdefault("metadata", {})["resourceVersion"] = node["metadata"]["resourceVersion"]
            try:
                self.request(
                    "PATCH", f"/api/v1/nodes/{name}", patch, content_type="application/merge-patch+json"
                )
                return
            except ApiStatus as e:
                if e.code != 409:
                    raise
        raise LabError(f"node {name} kept changing")

    def taint_node(self, name: str, key: str = TAINT_KEY, effect: str = "NoExecute") -> None:
        """A taint on the node; with NoExecute the taint-eviction controller deletes the pods
        that do not tolerate it (DisruptionTarget DeletionByTaintManager)."""

        def change(node: dict[str, Any]) -> dict[str, Any] | None:
            taints = list(node.get("spec", {}).get("taints") or [])
            if any(t["key"] == key and t["effect"] == effect for t in taints):
                return None
            return {"spec": {"taints": [*taints, {"key": key, "value": "true", "effect": effect}]}}

        self._patch_node(name, change)

    def untaint_node(self, name: str, key: str = TAINT_KEY) -> None:
        def change(node: dict[str, Any]) -> dict[str, Any] | None:
            taints = list(node.get("spec", {}).get("taints") or [])
            kept = [t for t in taints if t["key"] != key]
            return None if kept == taints else {"spec": {"taints": kept}}

        if self.node(name) is not None:
            self._patch_node(name, change)

    def node_not_ready(self, name: str) -> None:
        """kwok stops managing the node (as if its kubelet died): no lease renewals, its pods no
        longer played. node-lifecycle marks it Ready=Unknown after the grace period and taints it
        unreachable:NoExecute; its pods are evicted after their toleration (5 s in the lab)."""
        self._patch_node(name, lambda node: {"metadata": {"labels": {KWOK_NODE_LABEL: None}}})

    def node_ready(self, name: str) -> None:
        """kwok manages the node again: Ready, lease renewed; node-lifecycle lifts its taints."""
        if self.node(name) is None:
            return
        self._patch_node(name, lambda node: {"metadata": {"labels": {KWOK_NODE_LABEL: "fake"}}})

    def delete_node(self, name: str) -> None:
        """Delete the Node object: pod GC force-deletes its pods (after ~40-60 s, hard-coded)."""
        with contextlib.suppress(ApiStatus):
            self.request("DELETE", f"/api/v1/nodes/{name}")

    def add_node(
        self,
        name: str,
        *,
        cpu: str = NODE_CPU,
        memory: str = NODE_MEMORY,
        gpu: int = NODE_GPU,
        pods: str = NODE_PODS,
    ) -> str:
        """A new kwok node (Ready within a second or so)."""
        self.kubectl(
            "create",
            "-f",
            "-",
            input=yaml.safe_dump(node_manifest(name, cpu=cpu, memory=memory, gpu=gpu, pods=pods)),
        )
        self.wait(f"node {name} Ready", lambda: name in self._ready_nodes(), 60)
        return name

    def restore_nodes(self) -> None:
        """Bring the base nodes back to their start state (after a test changed them)."""
        for name in self.nodes:
            node = self.node(name)
            if node is None:
                self.add_node(name)
                continue
            self.untaint_node(name)
            self.node_ready(name)

    # ---- the audit log -------------------------------------------------------------

    def audit_mark(self) -> int:
        """A position in the audit log: pass it as ``since`` to :meth:`audit_writes`."""
        return self.audit_log.stat().st_size if self.audit_log.exists() else 0

    def audit_writes(
        self,
        since: int = 0,
        *,
        user: str | None = None,
        namespace: str | None = None,
        resource: str | None = None,
    ) -> list[dict[str, Any]]:
        """The write requests (create/update/patch/delete) the apiserver audited after ``since``."""
        out: list[dict[str, Any]] = []
        with self.audit_log.open("rb") as f:
            f.seek(since)
            for line in f:
                if not line.strip():
                    continue
                try:
                    event = json.loads(line)
                except ValueError:
                    continue  # a line being written
                if event.get("verb") not in WRITE_VERBS:
                    continue
                ref = event.get("objectRef") or {}
                if user is not None and (event.get("user") or {}).get("username") != user:
                    continue
                if namespace is not None and ref.get("namespace") != namespace:
                    continue
                if resource is not None and ref.get("resource") != resource:
                    continue
                out.append(event)
        return out

    def _write_lab_state(self) -> None:
        state_file = self.cp.state_file
        state = json.loads(state_file.read_text()) if state_file.exists() else {}
        state.update(
            lab_start_seconds=round(self.start_seconds, 2),
            ports=self.ports,
            nodes=self.nodes,
            audit_log=str(self.audit_log),
            extras=list(self.extras),
            extras_seconds=self.extras_seconds,
        )
        state_file.write_text(json.dumps(state, indent=2))


def _millicpu(quantity: str) -> int:
    q = str(quantity)
    return int(q[:-1]) if q.endswith("m") else int(float(q) * 1000)


def _pod_cpu(pod: dict[str, Any]) -> str:
    """A pod's cpu request as the scheduler counts it: the sum over its containers (requests,
    or limits when only limits are set), or the largest init container's if that is more."""
    spec = pod.get("spec") or {}

    def cpu(c: dict[str, Any]) -> int:
        res = c.get("resources") or {}
        value = (res.get("requests") or {}).get("cpu") or (res.get("limits") or {}).get("cpu") or "0"
        return _millicpu(str(value))

    main = sum(cpu(c) for c in spec.get("containers") or ())
    init = max((cpu(c) for c in spec.get("initContainers") or ()), default=0)
    return f"{max(main, init)}m"


def _cert_dir_holder(owner_file: Path) -> str | None:
    """The lab dir holding Trainer's global cert dir, or None when no recorded holder lives.
    A dir without owner.json yet is held (its creator is between mkdir and the write)."""
    try:
        owner = json.loads(owner_file.read_text())
    except FileNotFoundError:
        age = time.time() - owner_file.parent.stat().st_mtime
        return "(a lab starting)" if age < 10 else None
    except (OSError, ValueError):
        return None
    alive = any(
        _pid_runs(int(p["pid"]), str(p["binary"])) if p.get("binary") else _pid_alive(int(p["pid"]))
        for p in owner.get("pids") or ()
    )
    return str(owner.get("lab")) if alive else None


def release_trainer_cert_dir(lab_dir: Path | str) -> None:
    """Remove Trainer's global cert dir if the lab in LAB_DIR took it (``stop`` and ``down``)."""
    root = TRAINER_CERT_DIR.parent
    try:
        owner = json.loads((root / "owner.json").read_text())
    except (OSError, ValueError):
        return
    if owner.get("lab") == str(Path(lab_dir).resolve()):
        shutil.rmtree(root, ignore_errors=True)


class ApiStatus(LabError):
    """The API server answered with an error status."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


# ---- the async facade for tests (the old fake's method names) ---------------------------


def pod_name(job: str, replica: str = "master", index: int = 0) -> str:
    """The training operator's pod naming: ``<job>-<replica type, lower case>-<index>``."""
    return f"{job}-{replica.lower()}-{index}"


def replica_count(pytorchjob: Mapping[str, Any]) -> int:
    """The number of pods a PyTorchJob's spec asks for (every replica type's ``replicas``)."""
    specs = (pytorchjob.get("spec") or {}).get("pytorchReplicaSpecs") or {}
    return sum(int((spec or {}).get("replicas", 1)) for spec in specs.values())


class Kubeflow:
    """Async access to the lab's mechanisms, addressed like the training operator's pods.

    Everything it changes on nodes (taints, NotReady, deletion, added nodes) and the training
    operator's state are restored by :meth:`restore` (the ``kubeflow`` fixture calls it).
    """

    def __init__(self, lab: Lab) -> None:
        self.lab = lab
        self._changed_nodes = False
        self._added: list[str] = []

    async def _run(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def pods(self, namespace: str, job: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = await self._run(
            self.lab.pods, namespace, f"training.kubeflow.org/job-name={job}"
        )
        return out

    async def wait_pods(self, namespace: str, job: str, count: int = 1) -> list[dict[str, Any]]:
        """Until the job has ``count`` Running pods (bound the wait with asyncio.timeout)."""
        while True:
            pods = [
                p for p in await self.pods(namespace, job) if p.get("status", {}).get("phase") == "Running"
            ]
            if len(pods) >= count:
                return pods
            await asyncio.sleep(0.1)

    # -- any workload's pods, found by dispatch's labels (Jobs, JobSets, TrainJobs, PyTorchJobs) --

    async def workload_pods(self, namespace: str, job: str, submission: int) -> list[dict[str, Any]]:
        """The pods of submission ``submission`` of the DispatchJob ``job``, whatever made them."""
        out: list[dict[str, Any]] = await self._run(
            self.lab.pods, namespace, f"dispatch.dev/job={job},dispatch.dev/submission={submission}"
        )
        return out

    async def wait_workload_pods(
        self, namespace: str, job: str, submission: int, count: int = 1, *, besides: Sequence[str] = ()
    ) -> list[str]:
        """Until ``count`` of them run (not counting the pods named in ``besides``); their names."""
        while True:
            names = sorted(
                p["metadata"]["name"]
                for p in await self.workload_pods(namespace, job, submission)
                if p.get("status", {}).get("phase") == "Running"
                and not p["metadata"].get("deletionTimestamp")
                and p["metadata"]["name"] not in besides
            )
            if len(names) >= count:
                return names
            await asyncio.sleep(0.1)

    async def exit_pod(
        self, namespace: str, name: str, code: int, *, reason: str | None = None, container: str = "main"
    ) -> None:
        await self._run(self.lab.exit_pod, namespace, name, code, reason=reason, container=container)

    async def preempt_pod(self, namespace: str, name: str) -> str:
        out: str = await self._run(self.lab.preempt_pod, namespace, name)
        return out

    async def wait_pod_gone(self, namespace: str, name: str, uid: str | None = None) -> None:
        while True:
            pod = await self._run(self.lab.pod, namespace, name)
            if pod is None or (uid is not None and pod["metadata"]["uid"] != uid):
                return
            await asyncio.sleep(0.1)

    async def replicas(self, namespace: str, job: str) -> int:
        """How many pods the PyTorchJob asks for (the training operator may create workers first);
        waits for the PyTorchJob to exist, as ``wait_pods`` waits for its pods."""
        path = f"/apis/kubeflow.org/v1/namespaces/{namespace}/pytorchjobs/{job}"
        while True:
            try:
                return replica_count(await self._run(self.lab.request, "GET", path))
            except ApiStatus as e:
                if e.code != 404:
                    raise
            await asyncio.sleep(0.1)

    async def succeed(self, namespace: str, job: str) -> None:
        """Every container exits 0, workers first, then the master: waits for every replica first,
        since exiting only the pods that happen to exist leaves a later one running forever."""
        pods = await self.wait_pods(namespace, job, await self.replicas(namespace, job))
        pods.sort(
            key=lambda p: (
                p["metadata"]["labels"].get("training.kubeflow.org/replica-type") == "master",
                p["metadata"]["name"],
            )
        )
        for pod in pods:
            await self._run(self.lab.exit_pod, namespace, pod["metadata"]["name"], 0)

    async def exit(
        self,
        namespace: str,
        job: str,
        code: int,
        replica: str = "master",
        index: int = 0,
        *,
        reason: str | None = None,
        message: str | None = None,
    ) -> None:
        await self._run(
            self.lab.exit_pod, namespace, pod_name(job, replica, index), code, reason=reason, message=message
        )

    async def oom(self, namespace: str, job: str, replica: str = "master", index: int = 0) -> None:
        await self.exit(namespace, job, 137, replica, index, reason="OOMKilled")

    async def preempt(
        self,
        namespace: str,
        job: str,
        replica: str = "master",
        index: int = 0,
        *,
        keep: bool = False,
        whole_node: bool = False,
    ) -> str:
        out: str = await self._run(
            self.lab.preempt_pod, namespace, pod_name(job, replica, index), keep=keep, whole_node=whole_node
        )
        return out

    async def evict(self, namespace: str, job: str, replica: str = "master", index: int = 0) -> None:
        await self._run(self.lab.evict_pod, namespace, pod_name(job, replica, index))

    async def _node_of(self, namespace: str, job: str, replica: str, index: int) -> str:
        out: str = await self._run(self.lab.pod_node, namespace, pod_name(job, replica, index))
        return out

    async def taint_evict(self, namespace: str, job: str, replica: str = "master", index: int = 0) -> str:
        node = await self._node_of(namespace, job, replica, index)
        self._changed_nodes = True
        await self._run(self.lab.taint_node, node)
        return node

    async def untaint(self, node: str) -> None:
        await self._run(self.lab.untaint_node, node)

    async def delete_node(self, namespace: str, job: str, replica: str = "master", index: int = 0) -> str:
        node = await self._node_of(namespace, job, replica, index)
        self._changed_nodes = True
        await self._run(self.lab.delete_node, node)
        return node

    async def node_not_ready(self, namespace: str, job: str, replica: str = "master", index: int = 0) -> str:
        node = await self._node_of(namespace, job, replica, index)
        self._changed_nodes = True
        await self._run(self.lab.node_not_ready, node)
        return node

    async def node_ready(self, node: str) -> None:
        await self._run(self.lab.node_ready, node)

    async def add_node(self, *, cpu: str = NODE_CPU, memory: str = NODE_MEMORY, gpu: int = NODE_GPU) -> str:
        name = f"kwok-extra-{secrets.token_hex(3)}"
        self._added.append(name)
        out: str = await self._run(self.lab.add_node, name, cpu=cpu, memory=memory, gpu=gpu)
        return out

    async def delete_pod(self, namespace: str, name: str, grace_seconds: int | None = None) -> None:
        await self._run(self.lab.delete_pod, namespace, name, grace_seconds=grace_seconds)

    async def deadline(self, namespace: str, job: str, replica: str = "master", index: int = 0) -> None:
        await self._run(self.lab.deadline_pod, namespace, pod_name(job, replica, index))

    async def node_shutdown(self, namespace: str, job: str, replica: str = "master", index: int = 0) -> None:
        await self._run(self.lab.shutdown_pod, namespace, pod_name(job, replica, index))

    async def waiting(
        self,
        namespace: str,
        job: str,
        reason: str,
        message: str = "",
        replica: str = "master",
        index: int = 0,
    ) -> None:
        await self._run(self.lab.waiting_pod, namespace, pod_name(job, replica, index), reason, message)

    async def stop_training_operator(self) -> None:
        await self._run(self.lab.stop_training_operator)

    def kill_training_operator(self) -> None:
        self.lab.stop_training_operator(kill=True)

    async def start_training_operator(self) -> None:
        # In this (the main) thread, not a worker: the child's parent-death signal is tied to the
        # thread that forks it (see ControlPlane._spawn). It blocks the loop for ~2 s.
        self.lab.start_training_operator()

    def restore(self) -> None:
        """Undo what this test changed in the shared lab."""
        for name in self._added:
            self.lab.delete_node(name)
        if self._changed_nodes:
            self.lab.restore_nodes()
        if not self.lab.training_operator_running():
            self.lab.start_training_operator()


# ---- CLI --------------------------------------------------------------------------------


@contextlib.contextmanager
def lab(workdir: Path | str, **kwargs: Any) -> Iterator[Lab]:
    """``with lab(dir) as l: ...`` — starts and always stops."""
    running = Lab(workdir, **kwargs)
    try:
        running.start()
        yield running
    finally:
        running.stop()


def _cli(argv: Sequence[str] | None = None) -> int:
    def options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--nodes", type=int, default=3)
        parser.add_argument(
            "--with",
            dest="extras",
            default="",
            help=f"comma-separated opt-in extras: {','.join(EXTRAS)} (trainer implies jobset)",
        )

    def make(args: argparse.Namespace) -> Lab:
        extras = [e.strip() for e in args.extras.split(",") if e.strip()]
        return Lab(args.dir, nodes=args.nodes, start_timeout=args.timeout, extras=extras)

    argv = list(sys.argv[1:] if argv is None else argv)
    rc = detached_cli(
        argv, prog="python -m tests.support.lab", what="lab", timeout=120.0, make=make, add_arguments=options
    )
    if rc == 0 and argv[:1] == ["down"] and "--dir" in argv:
        release_trainer_cert_dir(argv[argv.index("--dir") + 1])
    return rc


if __name__ == "__main__":
    sys.exit(_cli())

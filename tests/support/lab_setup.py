"""The lab's parts before it runs: its constants (node sizes, priorities, names of the extras),
where its binaries are (:func:`resolve_lab_binaries`), and the manifests it applies (a kwok node,
Kueue's configuration). Imported by :mod:`tests.support.lab`, which holds the lab itself.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

from tests.support.controlplane import _build_script_env

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

NODE_BUILD_SCRIPT: Final = HERE.parents[1] / "hack" / "build-node.sh"
PYTORCH_INIT_CONTAINER: Final = """\
# The training operator's init container of a PyTorchJob's workers: waits until the master's
# Service name resolves, MaxTries times 2 s at most. Upstream's runs `nslookup` in alpine:3.10,
# which the lab's real node cannot pull (no registry); this one runs Python in the node's test image.
- name: init-pytorch
  image: {{.InitContainerImage}}
  imagePullPolicy: IfNotPresent
  resources:
    limits: {cpu: 100m, memory: 64Mi}
    requests: {cpu: 50m, memory: 32Mi}
  command:
  - python3
  - -c
  - |
    import socket, sys, time
    for _ in range(int(sys.argv[2])):
        try:
            socket.getaddrinfo(sys.argv[1], None)
            sys.exit(0)
        except OSError:
            print("waiting for master", sys.argv[1], flush=True)
            time.sleep(2)
    sys.exit(1)
  - {{.MasterAddr}}
  - '{{.MaxTries}}'
"""
"""A text/template of the training operator (``--pytorch-init-container-template-file``)."""


def pytorch_init_container_flags(directory: Path) -> list[str]:
    """The training operator's flags for :data:`PYTORCH_INIT_CONTAINER` in the real node's test
    image (``DISPATCH_NODE_TEST_TAG``, else what ``hack/build-node.sh --print-env`` names; no flags,
    upstream's default, when neither says)."""
    tag = os.environ.get("DISPATCH_NODE_TEST_TAG", "")
    if not tag and NODE_BUILD_SCRIPT.exists():
        out = subprocess.run(
            ["bash", str(NODE_BUILD_SCRIPT), "--print-env"], capture_output=True, text=True, check=False
        ).stdout
        tag = next(
            (
                line.split("=", 1)[1]
                for line in out.splitlines()
                if line.startswith("DISPATCH_NODE_TEST_TAG=")
            ),
            "",
        )
    if not tag:
        return []
    template = directory / "pytorch-init-container.yaml"
    template.parent.mkdir(parents=True, exist_ok=True)
    template.write_text(PYTORCH_INIT_CONTAINER)
    return [f"--pytorch-init-container-image={tag}", f"--pytorch-init-container-template-file={template}"]


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


class ApiStatus(LabError):
    """The API server answered with an error status."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


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


def expand_extras(names: Sequence[str]) -> tuple[str, ...]:
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
    for extra in expand_extras(extras):
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


__all__ = [
    "APISERVER_TOLERATION_FLAGS",
    "AUDIT_POLICY",
    "EXTRAS",
    "HERE",
    "HIGH_PRIORITY",
    "JOBSET_WEBHOOKS",
    "KCM_NODE_FLAGS",
    "KUEUE_CONVERSION_CRDS",
    "KUEUE_FRAMEWORKS",
    "KUEUE_NAMESPACE",
    "KUEUE_PODS_READY_TIMEOUT",
    "KUEUE_SECRET",
    "KWOK_CONFIG",
    "KWOK_NODE_LABEL",
    "LOW_PRIORITY",
    "NODE_CPU",
    "NODE_GPU",
    "NODE_MEMORY",
    "NODE_PODS",
    "NODE_PREFIX",
    "PREEMPT_ATTEMPTS",
    "TAINT_KEY",
    "TRAINER_CERT_DIR",
    "TRAINER_NAMESPACE",
    "TRAINER_RUNTIME",
    "TRAINER_WEBHOOKS",
    "TRAINING_OPERATOR_NAMESPACE",
    "TRAINING_OPERATOR_SA",
    "UNPULLABLE_IMAGE",
    "WEBHOOK_NAME",
    "WRITE_VERBS",
    "ApiStatus",
    "Kubectl",
    "LabBinaries",
    "LabError",
    "expand_extras",
    "kueue_config",
    "node_manifest",
    "resolve_lab_binaries",
    "wait_established",
]

"""The DispatchJobs and ``JobSpec``s the tests are about, built in one place.

A test names only what it is about (a backend, a rule, a queue) and takes the rest from here, so a
change of the DispatchJob's shape is made once, not in every suite that writes one.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel

from dispatch._model import Action, Actor, ActorKind, CauseKind, Enforcer, JobSpec, PlannedRule, Resources
from dispatch._workload import Target

REPO = Path(__file__).resolve().parents[2]
SEED_EXAMPLE = REPO / "examples" / "seed-dispatchjob.yaml"
"""The seed's DispatchJob as the tutorial gives it."""
API_VERSION = "dispatch.dev/v1alpha1"
IMAGE = "example.invalid/train:1"
"""The image of a DispatchJob on the lab (kwok runs no container, so it is never pulled)."""
RESOURCES: Mapping[str, str] = {"cpu": "1", "memory": "1Gi"}
"""What one pod of a DispatchJob on the lab asks for: the kwok nodes fit several."""

SEED_HISTORY = [("pending", "recovering", 2, "preempted"), ("recovering", "succeeded", 2, "none")]
"""The seed scenario's transitions (from, to, submission, cause): preempted once, then succeeded."""
ALICE = Actor(kind=ActorKind.HUMAN, id="alice")
"""The user who submits the library-mode tests' jobs."""
PREEMPTED_ONCE: list[dict[str, Any]] = [{"on": ["preempted"], "budget": 1}]
"""The smallest recovery that makes the seed scenario: one resubmission after a preemption."""


def workload_options(backend: str, **extra: Any) -> dict[str, Any]:
    """``spec.<backend>`` of a DispatchJob on the lab: the image, one CPU, and the runtime that a
    TrainJob cannot go without."""
    return {
        "image": IMAGE,
        "resources": dict(RESOURCES),
        **({"runtime": "torch-distributed"} if backend == "trainjob" else {}),
        **extra,
    }


def dispatch_job(
    name: str = "finetune",
    *,
    backend: str = "kubeflow",
    command: list[str] | None = None,
    namespace: str | None = None,
    backend_options: Mapping[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A DispatchJob as a user writes it: ``spec.backend``, ``spec.command``, ``spec.<backend>``
    when ``backend_options`` is given, and whatever else ``spec`` names (camelCase, as on the
    wire)."""
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    body_spec: dict[str, Any] = {
        "backend": backend,
        "command": command if command is not None else ["python", "train.py"],
    }
    if backend_options is not None:
        body_spec[backend] = dict(backend_options)
    body_spec.update(spec)
    return {"apiVersion": API_VERSION, "kind": "DispatchJob", "metadata": metadata, "spec": body_spec}


def manifest(name: str = "finetune", **fields: Any) -> str:
    """:func:`dispatch_job` as the YAML text ``kubectl apply -f -`` or ``kubectl dispatch plan``
    reads."""
    return yaml.safe_dump(dispatch_job(name, **fields), sort_keys=False)


def lab_manifest(
    backend: str,
    name: str,
    rules: list[dict[str, Any]],
    *,
    options: Mapping[str, Any] | None = None,
    **spec: Any,
) -> str:
    """A DispatchJob of ``backend`` on the lab (:func:`workload_options`, with ``options`` on top)
    and its recovery rules."""
    own = workload_options(backend, **(options or {}))
    return manifest(name, backend=backend, backend_options=own, recovery={"rules": rules}, **spec)


def owner_reference(name: str = "train", uid: str = "u", **extra: Any) -> dict[str, Any]:
    """The reference to a DispatchJob that the objects built for it carry."""
    return {"apiVersion": API_VERSION, "kind": "DispatchJob", "name": name, "uid": uid, **extra}


TARGET = Target("ns", "train", 3, owner_reference())
"""Submission 3 of ``ns/train``: what the build tests build for."""


Options = TypeVar("Options", bound=BaseModel)


def build_options(model: type[Options], env: dict[str, str] | None = None, **extra: Any) -> Options:
    """A backend's options as the build tests give them: an image, two CPUs, 4 GiB and a GPU."""
    resources = Resources(cpu="2", memory="4Gi", gpu=1)
    return model(image="img:1", resources=resources, env=env or {}, **extra)


def job_spec(
    backend: str | None = None,
    options: BaseModel | None = None,
    *,
    name: str = "train",
    command: tuple[str, ...] = ("python", "t.py"),
    **fields: Any,
) -> JobSpec:
    """A ``JobSpec`` with ``options`` where ``backend`` keeps them: its own field for kubeflow and
    slurm, ``options[backend]`` for every other backend."""
    if backend is not None and options is not None:
        if backend in ("kubeflow", "slurm"):
            fields[backend] = options
        else:
            fields["options"] = {backend: options}
    return JobSpec(name=name, command=command, **fields)


def restart_rule(budget: int, firings: int) -> PlannedRule:
    """The rule a scheduler enforces natively: restart on exactly [non-zero-exit out-of-memory]."""
    return PlannedRule(
        index=0,
        on=(CauseKind.NON_ZERO_EXIT, CauseKind.OUT_OF_MEMORY),
        action=Action.RESTART,
        budget=budget,
        enforcer=Enforcer.SCHEDULER,
        firings=firings,
    )


RESUBMIT = PlannedRule(
    index=0, on=(CauseKind.PREEMPTED,), action=Action.RESUBMIT, budget=3, enforcer=Enforcer.SUPERVISOR
)
"""The seed's rule as planned: the supervisor resubmits after a preemption, three times."""


def owner_manifest(namespace: str, name: str, image: str = IMAGE) -> dict[str, Any]:
    """A DispatchJob to own the PyTorchJobs of a library-level test (no operator runs for it)."""
    return dispatch_job(name, namespace=namespace, backend_options={"image": image})


def seed_job(name: str, **spec: Any) -> str:
    """The seed's DispatchJob (``examples/seed-dispatchjob.yaml``) on Kubeflow, named ``name``,
    with ``spec`` on top: the tutorial's job as the user applies it."""
    body = yaml.safe_load(SEED_EXAMPLE.read_text())
    body["metadata"]["name"] = name
    body["spec"].update({"backend": "kubeflow", "kubeflow": {"image": "pytorch/pytorch:2.4"}, **spec})
    return yaml.safe_dump(body)


IDENTITY_ENV = frozenset({"DISPATCH_JOB", "DISPATCH_NAMESPACE", "DISPATCH_SUBMISSION"})
"""The submission's identity every pod's training container carries."""


def identity(namespace: str, job: str, submission: int) -> list[dict[str, str]]:
    """The identity env entries of submission ``submission`` of ``namespace/job``, as built (sorted)."""
    values = {"DISPATCH_JOB": job, "DISPATCH_NAMESPACE": namespace, "DISPATCH_SUBMISSION": str(submission)}
    return [{"name": k, "value": v} for k, v in sorted(values.items())]


def without_identity(body: Any) -> Any:
    """``body`` without the identity env entries (and an env left empty): the recorded objects the
    build is compared with were recorded before the builders added them; the lab test of the pod
    options checks them on a real pod."""
    if isinstance(body, list):
        return [without_identity(item) for item in body]
    if not isinstance(body, dict):
        return body
    out = {k: without_identity(v) for k, v in body.items()}
    env = out.get("env")
    if isinstance(env, list):
        kept = [e for e in env if not (isinstance(e, dict) and e.get("name") in IDENTITY_ENV)]
        if kept:
            out["env"] = kept
        else:
            del out["env"]
    return out


def host_path_claim(namespace: str, claim: str, path: Path, *, size: str = "1Gi") -> list[dict[str, Any]]:
    """A PersistentVolume on the host directory ``path`` (hostPath: made by the cluster's
    administrator, which a DispatchJob's own volumes cannot be) pre-bound to the claim ``claim`` of
    ``namespace``, and that PersistentVolumeClaim: how a DispatchJob's pods reach a directory that
    outlives them (checkpoints). The volume is named ``<namespace>-<claim>`` and kept when the
    claim goes (Retain): the caller deletes it."""
    volume = f"{namespace}-{claim}"
    return [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": volume},
            "spec": {
                "capacity": {"storage": size},
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                "hostPath": {"path": str(path), "type": "DirectoryOrCreate"},
                "claimRef": {"namespace": namespace, "name": claim},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": claim, "namespace": namespace},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "",
                "volumeName": volume,
                "resources": {"requests": {"storage": size}},
            },
        },
    ]

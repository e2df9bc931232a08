"""The kit's backends and the objects of team/train they are tested on, shared by the kit's unit
suites: each backend by name with its kind and plural, a failed PyTorchJob, a preempted pod, and a
kit backend that restarts into a job it did not create.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from dispatch._backends.job._adapter import JOB as JOB_KIND
from dispatch._backends.job._adapter import JobBackend
from dispatch._backends.jobset._adapter import JOBSET, JobSetBackend
from dispatch._backends.kubeflow._adapter import PYTORCHJOB, KubeflowBackend
from dispatch._backends.trainjob._adapter import TRAINJOB, TrainJobBackend
from dispatch._workload import Kind, WorkloadBackend
from tests.support.recorded import RecordedApi

Body = dict[str, Any]

BACKENDS: dict[str, tuple[Kind, Callable[..., WorkloadBackend], str]] = {
    "kubeflow": (PYTORCHJOB, KubeflowBackend, "pytorchjobs"),
    "job": (JOB_KIND, JobBackend, "jobs"),
    "jobset": (JOBSET, JobSetBackend, "jobsets.jobset.x-k8s.io"),
    "trainjob": (TRAINJOB, TrainJobBackend, "trainjobs.trainer.kubeflow.org"),
}
"""Each kit backend by name: its kind, its class, and the plural ``kubectl get`` names it by."""


CREATED = "2026-12-01T12:00:00Z"
"""When the objects of team/train were created and released."""


def pytorchjob(name: str = "train-1", *, ended: bool = True, annotations: Body | None = None) -> Body:
    """A PyTorchJob of job team/train, failed by its controller (its pods gone, nothing says why)."""
    job, _, n = name.rpartition("-")
    conditions = [{"type": "Failed", "status": "True", "reason": "PyTorchJobFailed", "message": "failed"}]
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {
            "name": name,
            "namespace": "team",
            "uid": f"uid-{name}",
            "resourceVersion": "10",
            "creationTimestamp": CREATED,
            "labels": {
                "dispatch.dev/job": job,
                "dispatch.dev/submission": n,
                "app.kubernetes.io/managed-by": "dispatch",
            },
            "annotations": {"dispatch.dev/released": CREATED, **(annotations or {})},
        },
        "spec": {"runPolicy": {"suspend": False}, "pytorchReplicaSpecs": {}},
        "status": {"conditions": conditions if ended else [], "startTime": CREATED},
    }


JOB = "team/train"
"""The dispatch job whose objects these are."""


def master_pod(uid: str, version: str, node: str, status: dict[str, Any]) -> dict[str, Any]:
    """The master pod of team/train-1 (uid, resourceVersion, node and status as given)."""
    return {
        "metadata": {
            "name": "train-1-master-0",
            "namespace": "team",
            "uid": uid,
            "resourceVersion": version,
            "labels": {
                "dispatch.dev/job": "train",
                "dispatch.dev/submission": "1",
                "app.kubernetes.io/managed-by": "dispatch",
            },
        },
        "spec": {"nodeName": node},
        "status": status,
    }


def preempted_pod() -> dict[str, Any]:
    """The running master of team/train-1, marked by kube-scheduler for preemption."""
    preempted = {
        "type": "DisruptionTarget",
        "status": "True",
        "reason": "PreemptionByScheduler",
        "message": "default-scheduler: preempting to accommodate a higher priority pod",
        "lastTransitionTime": "2026-12-01T12:05:00Z",
    }
    return master_pod("pod-1", "20", "kwok-node-0", {"phase": "Running", "conditions": [preempted]})


def restarted_kit(observer: list[WorkloadBackend]) -> tuple[WorkloadBackend, RecordedApi]:
    """A kit backend that finds team/train-1 running with its master preempted: an object it did
    not create, which it must stop (the training operator would go on)."""
    api = RecordedApi({"stream": [], "events": []})
    backend = KubeflowBackend(api, clock=lambda: 1.8e9)  # type: ignore[arg-type]
    backend.watches.tasks = [asyncio.get_running_loop().create_task(asyncio.sleep(3600))]  # no informer runs
    observer.append(backend)
    backend.watches.object_changed(None, backend.cache.packed(pytorchjob(ended=False)))
    backend.watches.pod_changed(None, backend.cache.packed_pod(preempted_pod()))
    return backend, api

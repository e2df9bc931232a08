"""The Kubernetes workload kit: one generic backend, one small :class:`Kind` per workload kind.

Modelled on Kueue's jobframework (``GenericJob`` plus one folder per integration): the kit owns the
cache, our own writes, tombstones, the fence, stop-by-suspend, pod evidence and the classification
of causes; a kind (``dispatch._kubeflow``: PyTorchJob, ``dispatch._job``: batch/v1 Job) says where
its objects live, how one is built, held and released, and what its own status reports.
See docs/backends.md, "The kit's API".
"""

from __future__ import annotations

from ._backend import (
    OwnerLookup,
    WorkloadBackend,
    dispatchjob_owner,
    explain,
    refused_for_good,
    split_id,
)
from ._classify import (
    POD,
    Evidence,
    Verdict,
    classify,
    container_restarts,
    detail,
    object_shape,
    parse_time,
    pod_evidence,
    project_object,
    project_pod,
    true_condition,
)
from ._kind import (
    CONDITION,
    SPEC_SUSPEND,
    Body,
    Clip,
    HeldBySpecSuspend,
    Kind,
    Outcome,
    Prefixed,
    Refused,
    Resource,
    Shape,
    Target,
    Where,
    check_env,
    check_size,
    conditions,
    container,
    failed_exit,
    labels,
    merge,
    metadata,
    object_name,
    project,
    restart_budget,
)
from ._open import open_workload

__all__ = [
    "CONDITION",
    "POD",
    "SPEC_SUSPEND",
    "Body",
    "Clip",
    "Evidence",
    "HeldBySpecSuspend",
    "Kind",
    "Outcome",
    "OwnerLookup",
    "Prefixed",
    "Refused",
    "Resource",
    "Shape",
    "Target",
    "Verdict",
    "Where",
    "WorkloadBackend",
    "check_env",
    "check_size",
    "classify",
    "conditions",
    "container",
    "container_restarts",
    "detail",
    "dispatchjob_owner",
    "explain",
    "failed_exit",
    "labels",
    "merge",
    "metadata",
    "object_name",
    "object_shape",
    "open_workload",
    "parse_time",
    "pod_evidence",
    "project",
    "project_object",
    "project_pod",
    "refused_for_good",
    "restart_budget",
    "split_id",
    "true_condition",
]

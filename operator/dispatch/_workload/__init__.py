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
    Evidence,
    Verdict,
    classify,
    container_restarts,
    detail,
    parse_time,
    pod_evidence,
    true_condition,
)
from ._kind import (
    Body,
    HeldBySpecSuspend,
    Kind,
    Outcome,
    Refused,
    Resource,
    Target,
    check_env,
    check_size,
    container,
    failed_exit,
    labels,
    metadata,
    object_name,
    restart_budget,
)
from ._open import open_workload

__all__ = [
    "Body",
    "Evidence",
    "HeldBySpecSuspend",
    "Kind",
    "Outcome",
    "OwnerLookup",
    "Refused",
    "Resource",
    "Target",
    "Verdict",
    "WorkloadBackend",
    "check_env",
    "check_size",
    "classify",
    "container",
    "container_restarts",
    "detail",
    "dispatchjob_owner",
    "explain",
    "failed_exit",
    "labels",
    "metadata",
    "object_name",
    "open_workload",
    "parse_time",
    "pod_evidence",
    "refused_for_good",
    "restart_budget",
    "split_id",
    "true_condition",
]

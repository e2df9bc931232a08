"""The Kubernetes workload kit: one generic backend, one small :class:`Kind` per workload kind.

Modelled on Kueue's jobframework (``GenericJob`` plus one folder per integration): the kit owns the
cache, our own writes, tombstones, the fence, stop-by-suspend, pod evidence and the classification
of causes; a kind (each Kubernetes backend's ``_kind.py`` under ``dispatch._backends``) says where
its objects live, how one is built, held and released, and what its own status reports.
See docs/backends.md, "The kit's API".
"""

from __future__ import annotations

from ._backend import WorkloadBackend
from ._classify import Verdict, classify
from ._evidence import Evidence, container_restarts, pod_evidence
from ._fields import detail, parse_time, true_condition
from ._kept import POD, object_shape, project_object, project_pod
from ._kind import (
    SPEC_SUSPEND,
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
from ._mask import CONDITION, SHARED, Body, Clip, Mask, Prefixed, Select, Shared, conditions, merge, project
from ._open import open_workload
from ._requests import OwnerLookup, dispatchjob_owner, explain, refused_for_good, split_id

__all__ = [
    "CONDITION",
    "POD",
    "SHARED",
    "SPEC_SUSPEND",
    "Body",
    "Clip",
    "Evidence",
    "HeldBySpecSuspend",
    "Kind",
    "Mask",
    "Outcome",
    "OwnerLookup",
    "Prefixed",
    "Refused",
    "Resource",
    "Select",
    "Shared",
    "Target",
    "Verdict",
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

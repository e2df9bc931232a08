"""The ``jobset`` backend: each submission of a DispatchJob is one JobSet, on the workload kit.

See ``dispatch._backends.jobset._kind`` for how the JobSet is built (held by ``spec.suspend``, released by
unsuspending, the native rule as ``failurePolicy.maxRestarts`` + rules over the child Job's
``podFailurePolicy``) and docs/backends.md.
Object ids are ``"<namespace>/<jobset name>"``; job ids ``"<namespace>/<name>"`` of a DispatchJob.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..._kubeclient import Client
from ..._workload import WorkloadBackend, open_workload
from ._kind import JOBSET, JobSetKind, build


class JobSetBackend(WorkloadBackend):
    """A :class:`~dispatch.Backend` running each submission as a JobSet."""

    def __init__(self, api: Client, *, namespaces: Sequence[str] | None = None, **options: Any) -> None:
        super().__init__(JOBSET, api, namespaces=namespaces, **options)


async def open_adapter(config: Mapping[str, object] | None = None) -> JobSetBackend:
    """Entry point of the library (``dispatch.open("jobset", ...)``).

    Config: ``kubeconfig`` (path; default $KUBECONFIG, ~/.kube/config, else in-cluster),
    ``context``, ``namespaces`` (list; default all), ``stop_ended`` (default true), ``owner``
    (``dispatchjob``, the default, or ``none`` to run without the DispatchJob CRD).
    """
    return await open_workload(JOBSET.name, JobSetBackend, config)


__all__ = ["JOBSET", "JobSetBackend", "JobSetKind", "build", "open_adapter"]

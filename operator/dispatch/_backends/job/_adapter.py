"""The ``job`` backend: each submission of a DispatchJob is one batch/v1 Job, on the workload kit.

See ``dispatch._backends.job._kind`` for how the Job is built (held by ``spec.suspend``, released by
unsuspending, the native rule as ``backoffLimit`` + ``podFailurePolicy``) and docs/backends.md.
Object ids are ``"<namespace>/<job name>"``; job ids ``"<namespace>/<name>"`` of a DispatchJob.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..._kubeclient import Client
from ..._workload import WorkloadBackend, open_workload
from ._kind import JOB, BatchJobKind, build


class JobBackend(WorkloadBackend):
    """A :class:`~dispatch.Backend` running each submission as a batch/v1 Job."""

    def __init__(self, api: Client, *, namespaces: Sequence[str] | None = None, **options: Any) -> None:
        super().__init__(JOB, api, namespaces=namespaces, **options)


async def open_adapter(config: Mapping[str, object] | None = None) -> JobBackend:
    """Entry point of the library (``dispatch.open("job", ...)``); config as for every kit backend
    (see :func:`dispatch._workload.open_workload`)."""
    return await open_workload(JOB.name, JobBackend, config)


__all__ = ["JOB", "BatchJobKind", "JobBackend", "build", "open_adapter"]

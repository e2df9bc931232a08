"""The ``trainjob`` backend: each submission of a DispatchJob is one TrainJob (Kubeflow Trainer v2),
on the workload kit.

See ``dispatch._backends.trainjob._kind`` for how the TrainJob is built (held by ``spec.suspend``, released
by unsuspending, its pods labelled through a runtime patch) and docs/backends.md.
Object ids are ``"<namespace>/<trainjob name>"``; job ids ``"<namespace>/<name>"`` of a DispatchJob.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..._kubeclient import Client
from ..._workload import WorkloadBackend, open_workload
from ._kind import TRAINJOB, TrainJobKind, build


class TrainJobBackend(WorkloadBackend):
    """A :class:`~dispatch.Backend` running each submission as a TrainJob."""

    def __init__(self, api: Client, *, namespaces: Sequence[str] | None = None, **options: Any) -> None:
        super().__init__(TRAINJOB, api, namespaces=namespaces, **options)


async def open_adapter(config: Mapping[str, object] | None = None) -> TrainJobBackend:
    """Entry point of the library (``dispatch.open("trainjob", ...)``); config as the jobset
    backend's (``kubeconfig``, ``context``, ``namespaces``, ``stop_ended``, ``owner``)."""
    return await open_workload(TRAINJOB.name, TrainJobBackend, config)


__all__ = ["TRAINJOB", "TrainJobBackend", "TrainJobKind", "build", "open_adapter"]

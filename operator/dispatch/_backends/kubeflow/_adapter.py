"""The Kubeflow adapter: each submission of a DispatchJob is one PyTorchJob (``kubeflow.org/v1``),
a kind on the workload kit (``dispatch._workload``).

See docs/kubeflow.md. Object ids are ``"<namespace>/<pytorchjob name>"``; job ids are
``"<namespace>/<name>"`` of a DispatchJob. How the PyTorchJob is built, held and released, and what
its status says: ``dispatch._backends.kubeflow._kind``; the cache, the fence, stop-by-suspend and the
classification of causes: the kit (:class:`~dispatch._workload.WorkloadBackend`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..._kubeclient import Client
from ..._model import Phase
from ..._workload import WorkloadBackend, open_workload, refused_for_good, split_id
from . import CAPABILITIES
from ._kind import PYTORCHJOB, PyTorchJobKind, build


class KubeflowBackend(WorkloadBackend):
    """A :class:`~dispatch.Backend` running each submission as a PyTorchJob."""

    def __init__(self, api: Client, *, namespaces: Sequence[str] | None = None, **options: Any) -> None:
        super().__init__(PYTORCHJOB, api, namespaces=namespaces, **options)


async def open_adapter(config: Mapping[str, object] | None = None) -> KubeflowBackend:
    """Entry point of the library (``dispatch.open("kubeflow", ...)``); config as for every kit
    backend (see :func:`dispatch._workload.open_workload`)."""
    return await open_workload(PYTORCHJOB.name, KubeflowBackend, config)


__all__ = [
    "CAPABILITIES",
    "PYTORCHJOB",
    "KubeflowBackend",
    "Phase",
    "PyTorchJobKind",
    "build",
    "open_adapter",
    "refused_for_good",
    "split_id",
]

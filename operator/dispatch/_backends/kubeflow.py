"""The ``kubeflow`` backend's declaration: PyTorchJobs of the Kubeflow Training Operator v1."""

from __future__ import annotations

from typing import Final

from .._capabilities import KUBEFLOW
from .._model import KubeflowOptions
from ._common import workload_backend

BACKEND: Final = workload_backend(
    name="kubeflow",
    summary="PyTorchJobs of the Kubeflow Training Operator v1",
    api_group="kubeflow.org",
    plural="pytorchjobs",
    kind="PyTorchJob",
    capabilities=KUBEFLOW,
    options=KubeflowOptions,
    adapter="dispatch._kubeflow",
    opener="KubeflowBackend",
)

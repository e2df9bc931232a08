"""The ``kubeflow`` backend's declaration: PyTorchJobs of the Kubeflow Training Operator v1."""

from __future__ import annotations

from typing import Final

from .._capabilities import KUBEFLOW
from .._model import KubeflowOptions
from .._registry import BackendInfo, PolicyRule, Where
from ._common import NODE_RULE, POD_EVENT_RULE, POD_RULE

BACKEND: Final = BackendInfo(
    name="kubeflow",
    summary="PyTorchJobs of the Kubeflow Training Operator v1",
    where=Where.KUBERNETES,
    capabilities=KUBEFLOW,
    open="dispatch._kubeflow:open_adapter",
    open_in_operator="dispatch._kubeflow:KubeflowBackend",
    options=KubeflowOptions,
    options_required=True,
    options_hint="the image, at least",
    rbac=(
        PolicyRule(
            ("kubeflow.org",),
            ("pytorchjobs",),
            ("create", "get", "list", "watch", "patch", "delete"),
            why="One PyTorchJob per submission: patch to release (unsuspend) it; delete to end it "
            "(cancel, supervisor-side restarts).",
        ),
        POD_RULE,
        POD_EVENT_RULE,
        NODE_RULE,
    ),
    metric_resources=("pytorchjobs", "pytorchjobs/status", "pods", "events"),
)

"""The ``kubeflow`` backend's declaration: PyTorchJobs of the Kubeflow Training Operator v1."""

from __future__ import annotations

from typing import Final

from ..._model import Action, Capabilities, CauseKind, NativeRule
from ..._registry import ApiResource
from .._kit import Image, PodOptions, workload_backend

RESOURCE: Final = ApiResource(group="kubeflow.org", version="v1", plural="pytorchjobs", kind="PyTorchJob")


class KubeflowOptions(PodOptions):
    """How to run on Kubeflow as a PyTorchJob (Master plus Workers for ``nodes``)."""

    image: Image
    """The image of every pod, Master and Workers."""


CAPABILITIES: Final = Capabilities(
    native=(
        NativeRule(
            causes=frozenset({CauseKind.NON_ZERO_EXIT, CauseKind.OUT_OF_MEMORY}),
            action=Action.RESTART,
            note=(
                "restartPolicy OnFailure restarts failed pods in place, up to backoffLimit; the training"
                " operator also recreates a preempted, evicted or node-lost pod uncounted, so dispatch"
                " stops the PyTorchJob on such a cause (while no dispatch operator runs, it cannot)"
            ),
            backoff=(
                "the kubelet's: under restartPolicy OnFailure it restarts the failed container in place"
                " after 10 s, doubling up to 5 min (its crash-loop backoff)"
            ),
        ),
    )
)
"""Kubeflow's restartPolicy OnFailure restarts failed pods in place, exactly [non-zero-exit
out-of-memory], up to ``backoffLimit`` (budget 0..100)."""

BACKEND: Final = workload_backend(
    name="kubeflow",
    summary="PyTorchJobs of the Kubeflow Training Operator v1",
    resource=RESOURCE,
    capabilities=CAPABILITIES,
    options=KubeflowOptions,
    adapter="dispatch._backends.kubeflow._adapter",
    opener="KubeflowBackend",
)

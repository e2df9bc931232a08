"""The ``trainjob`` backend's declaration: TrainJobs of Kubeflow Trainer v2
(``trainer.kubeflow.org/v1alpha1``, v2.2.0), run as a JobSet built from a (Cluster)TrainingRuntime.

Facts only (the adapter, ``._adapter``, is opened lazily). No native rule: the runtime,
not the TrainJob, holds the JobSet's ``failurePolicy`` and the child Jobs' ``backoffLimit`` (the
TrainJob's ``runtimePatches`` may change only pod-template fields), so what the Trainer's JobSet
would retry is not the plan's rule. dispatch stops the TrainJob on the first failed pod and every
rule goes to the supervisor.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal, Self

from pydantic import Field, model_validator

from ..._model import NAME_PATTERN, Capabilities
from ..._registry import ApiResource
from .._kit import Image, PodOptions, workload_backend

RESOURCE: Final = ApiResource(
    group="trainer.kubeflow.org", version="v1alpha1", plural="trainjobs", kind="TrainJob"
)

RuntimeName = Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")]
"""A (Cluster)TrainingRuntime's name: a DNS subdomain, as Kubernetes names objects."""
JobName = Annotated[str, Field(min_length=1, max_length=63, pattern=NAME_PATTERN)]


class TrainJobOptions(PodOptions):
    """How to run as a TrainJob: ``nodes`` nodes of the runtime's trainer, with the job's command."""

    image: Image | None = None
    """The trainer's image; default: the runtime's."""
    runtime: RuntimeName
    """The (Cluster)TrainingRuntime's name (``spec.runtimeRef.name``), e.g. ``torch-distributed``."""
    runtime_kind: Literal["ClusterTrainingRuntime", "TrainingRuntime"] = "ClusterTrainingRuntime"
    trainer_job: JobName = "node"
    """The runtime's replicated Job that runs the trainer (``node`` in every upstream runtime): its
    pod template gets dispatch's labels, by which dispatch finds the pods."""

    @model_validator(mode="after")
    def _carried(self) -> Self:
        """Refuse the pod options a TrainJob cannot carry: Trainer v2.2's ``runtimePatches`` patch
        only a pod's volumes, scheduling, service account, pull secrets, labels and annotations and
        a container's env and mounts, and ``spec.trainer`` has no ``envFrom`` or working directory;
        silently dropping them would run a job that is not the one written."""
        for field, value in UNCARRIED.items():
            if getattr(self, field) not in (None, [], {}):
                raise ValueError(
                    f"{value}: a TrainJob cannot carry it (Trainer v2.2's runtimePatches have no such field)"
                )
        return self


UNCARRIED: Final = {
    "env_from": "envFrom",
    "priority_class_name": "priorityClassName",
    "working_dir": "workingDir",
}
"""The pod options (attribute: wire name) a TrainJob refuses."""


CAPABILITIES: Final = Capabilities(
    stop_grace=(
        "the runtime's pod template's terminationGracePeriodSeconds (a TrainJob's runtimePatches cannot"
        " set it)"
    )
)

BACKEND: Final = workload_backend(
    name="trainjob",
    summary="TrainJobs of Kubeflow Trainer v2 (trainer.kubeflow.org/v1alpha1), on JobSet",
    resource=RESOURCE,
    capabilities=CAPABILITIES,
    options=TrainJobOptions,
    adapter="dispatch._backends.trainjob._adapter",
    opener="TrainJobBackend",
    options_hint="the runtime, at least",
)

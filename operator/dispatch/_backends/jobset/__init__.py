"""The ``jobset`` backend's declaration: JobSets (``jobset.x-k8s.io/v1alpha2``) run by the JobSet
controller, v0.11.1, on batch/v1 Jobs.

Facts only (the adapter, ``._adapter``, is opened lazily). The native rule is exact because
of how the JobSet is built (see ``._kind``): one replicated Job whose
``podFailurePolicy`` fails the Job at once on a disrupted pod (rule 0) and on the training
container's exit != 0 (rule 1), ``backoffLimit: 0`` for anything else; the JobSet's
``failurePolicy`` restarts it (``RestartJobSet``: every child Job recreated) only on a Job failed by
rule 1 (reason ``PodFailurePolicy``, message ``matching FailJob rule at index 1``), fails it
(``FailJobSet``) on any other Job failure, and stops restarting when ``restartsCountTowardsMax``
reaches ``maxRestarts`` = what is left of the budget (failure_policy.go:
``restartJobSetActionApplier``; reason ``ReachedMaxRestarts``). A container that exits != 0 for a
reason dispatch calls otherwise (a start error is exit 128) would be restarted too, so the kit
stops the JobSet on such a cause itself.
"""

from __future__ import annotations

from typing import Final

from ..._model import Action, Capabilities, CauseKind, NativeRule
from ..._registry import ApiResource
from .._kit import Image, PodOptions, workload_backend

RESOURCE: Final = ApiResource(group="jobset.x-k8s.io", version="v1alpha2", plural="jobsets", kind="JobSet")


class JobSetOptions(PodOptions):
    """How to run as a JobSet: one replicated Job of ``nodes`` pods (Indexed), each with this
    image, resources and env, and the job's command."""

    image: Image
    """The image of every pod."""


CAPABILITIES: Final = Capabilities(
    native=(
        NativeRule(
            causes=frozenset({CauseKind.NON_ZERO_EXIT, CauseKind.OUT_OF_MEMORY}),
            action=Action.RESTART,
            note=(
                "the JobSet controller restarts the whole JobSet (every pod recreated) when the training"
                " container exits non-zero (an OOM kill is exit 137), up to failurePolicy.maxRestarts;"
                " a disrupted pod or any other failure fails it (FailJobSet), and dispatch stops it on a"
                " non-zero exit it classifies otherwise"
            ),
            backoff=(
                "none: the JobSet controller recreates the child Jobs at once"
                " (failure_policy.go: RestartJobSet has no delay)"
            ),
        ),
    )
)
"""JobSet restarts on exactly [non-zero-exit out-of-memory], up to ``maxRestarts`` (budget 0..100)."""

BACKEND: Final = workload_backend(
    name="jobset",
    summary="JobSets of the JobSet controller (jobset.x-k8s.io/v1alpha2), on batch/v1 Jobs",
    resource=RESOURCE,
    capabilities=CAPABILITIES,
    options=JobSetOptions,
    adapter="dispatch._backends.jobset._adapter",
    opener="JobSetBackend",
)

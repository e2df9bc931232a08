"""The ``job`` backend's declaration: batch/v1 Jobs run by kube-controller-manager's Job controller.

Facts only (the adapter, ``._adapter``, is opened lazily). The native rule is exact because of
how the Job is built (see ``._kind``): ``restartPolicy: Never``, ``backoffLimit`` = what
is left of the budget, and a ``podFailurePolicy`` that fails the Job at once on a pod with a
``DisruptionTarget`` condition and counts a container exit != 0 of the training container. The Job
controller replaces a counted pod (``podReplacementPolicy: Failed``: only once it has fully failed)
until ``failed > backoffLimit`` (job_controller.go: ``exceedsBackoffLimit``), so L restarts are
exactly ``backoffLimit: L``. A pod that fails in any other way (refused by its kubelet, say) is
counted too, so the kit stops the Job on such a cause itself, as it does for Kubeflow's uncounted
recreations.
"""

from __future__ import annotations

from typing import Final

from ..._model import Action, Capabilities, CauseKind, NativeRule
from ..._registry import ApiResource
from .._kit import Image, PodOptions, workload_backend

RESOURCE: Final = ApiResource(group="batch", version="v1", plural="jobs", kind="Job")


class JobOptions(PodOptions):
    """How to run as a batch/v1 Job: one pod per node (an Indexed Job for more than one), each
    with this image, resources and env, and the job's command."""

    image: Image
    """The image of every pod."""


CAPABILITIES: Final = Capabilities(
    native=(
        NativeRule(
            causes=frozenset({CauseKind.NON_ZERO_EXIT, CauseKind.OUT_OF_MEMORY}),
            action=Action.RESTART,
            note=(
                "the Job controller replaces a pod whose container exited non-zero (an OOM kill is"
                " exit 137) up to backoffLimit, and fails the Job at once on a disrupted pod"
                " (podFailurePolicy FailJob on DisruptionTarget); dispatch stops the Job on any other"
                " pod failure, which the Job controller would count and replace"
            ),
            backoff=(
                "the Job controller's: it replaces a failed pod after 10 s, doubling up to 10 min"
                " (job_controller.go: DefaultJobPodFailureBackOff, MaxJobPodFailureBackOff)"
            ),
        ),
    ),
    time_limit=(
        "the Job controller fails the Job at activeDeadlineSeconds (condition reason DeadlineExceeded),"
        " counted from its startTime, which a release from suspend sets: pending pods count too;"
        " its pods get their terminationGracePeriodSeconds"
    ),
)
"""The Job controller restarts (replaces) failed pods, exactly [non-zero-exit out-of-memory], up
to ``backoffLimit`` (budget 0..100)."""

BACKEND: Final = workload_backend(
    name="job",
    summary="batch/v1 Jobs (the Job controller of kube-controller-manager)",
    resource=RESOURCE,
    capabilities=CAPABILITIES,
    options=JobOptions,
    adapter="dispatch._backends.job._adapter",
    opener="JobBackend",
)

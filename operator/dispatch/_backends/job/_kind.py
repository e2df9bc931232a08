"""batch/v1 Job as a workload kind: one Job per (job, submission), named ``<job>-<n>``.

Created with ``spec.suspend: true`` (the Job controller creates no pod until dispatch releases it),
``restartPolicy: Never`` and ``podReplacementPolicy: Failed`` (a replacement pod is created only
once the failed one has fully terminated, so two incarnations never run at once). One pod per node:
``completions = parallelism = nodes``, Indexed when more than one.

The plan's scheduler-enforced ``restart`` rule on {non-zero-exit, out-of-memory} with L restarts left
becomes ``backoffLimit: L`` and a ``podFailurePolicy`` (kube-controller-manager's job_controller.go
and pod_failure_policy.go, v1.34): rules are matched in order, first match wins;

1. ``FailJob`` on a pod condition ``DisruptionTarget=True`` (preempted by kube-scheduler, evicted,
   deleted by the taint manager or the pod GC, the kubelet's node shutdown): the Job fails at once
   (FailureTarget, reason PodFailurePolicy); the pod says why and the supervisor's rules answer it;
2. ``Count`` on the training container's exit code ``NotIn [0]``: counted toward ``backoffLimit``;
   the Job fails when ``failed > backoffLimit`` (``exceedsBackoffLimit``), so L failures are
   replaced and the (L+1)th fails the Job (reason BackoffLimitExceeded).

Without such a rule (or with nothing left of it): ``backoffLimit: 0`` and no policy: the first
failed pod fails the Job, whose pods say why. A pod that fails in any other way under a rule (no
exit code: refused by its kubelet) is counted and replaced by the Job controller, which is not the
rule: the kit sees its terminal evidence and stops the Job (suspend + ``dispatch.dev/ended``).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Final

from ..._errors import BackendError
from ..._model import Capabilities, Cause, CauseKind, Enforcer, JobSpec, Plan
from ..._workload import (
    SPEC_SUSPEND,
    Body,
    HeldBySpecSuspend,
    Mask,
    Outcome,
    Resource,
    Target,
    check_env,
    check_size,
    conditions,
    container,
    detail,
    failed_exit,
    labels,
    merge,
    metadata,
    restart_budget,
    true_condition,
)
from .._kit import identity_env, pod_grace, pod_template
from . import BACKEND
from . import RESOURCE as DECLARED

CONTAINER: Final = "main"
RESOURCE: Final = Resource(**asdict(DECLARED))
RECOVERED: Final = frozenset({CauseKind.NON_ZERO_EXIT, CauseKind.OUT_OF_MEMORY})
"""The causes the Job controller answers under the native rule (exit code != 0; an OOM kill is 137)."""


def build(target: Target, spec: JobSpec, plan: Plan) -> Body:
    """The Job manifest for ``target``."""
    options = BACKEND.options_of(spec)
    if options is None:
        raise BackendError(
            f"job {target.namespace}/{target.job_name}: the job backend needs spec.job (the image)"
        )
    check_env(options.env, "spec.job.env")
    env = {**options.env, **identity_env(target.namespace, target.job_name, target.submission)}
    budget = restart_budget(plan)
    job_spec: Body = {
        "suspend": True,
        "completions": spec.nodes,
        "parallelism": spec.nodes,
        "backoffLimit": budget or 0,
        "podReplacementPolicy": "Failed",
        "template": pod_template(
            options,
            container(CONTAINER, options.image, spec, env, options.resources),
            labels(target.job_name, target.submission),
            restart_policy="Never",
            grace_seconds=pod_grace(spec),
        ),
    }
    if spec.nodes > 1:
        job_spec["completionMode"] = "Indexed"
    if plan.time_limit is not None and plan.time_limit.enforcer is Enforcer.SCHEDULER:
        # The Job controller's own deadline, counted from the release (startTime), which fails
        # the Job with reason DeadlineExceeded: classified time-limit.
        job_spec["activeDeadlineSeconds"] = plan.time_limit.seconds
    if budget:
        job_spec["podFailurePolicy"] = {
            "rules": [
                {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
                {
                    "action": "Count",
                    "onExitCodes": {"containerName": CONTAINER, "operator": "NotIn", "values": [0]},
                },
            ]
        }
    body: Body = {
        "apiVersion": RESOURCE.api_version,
        "kind": RESOURCE.kind,
        "metadata": metadata(target, no_capacity_after=options.no_capacity_after_seconds, budget=budget),
        "spec": job_spec,
    }
    return check_size(body, "Job")


def _failed_cause(condition: Body, in_place: bool, last_restart: Cause | None) -> Cause:
    reason = condition.get("reason") or ""
    message = condition.get("message") or ""
    if reason == "DeadlineExceeded":
        return Cause(kind=CauseKind.TIME_LIMIT, detail=detail("Job", reason, message))
    if reason == "BackoffLimitExceeded" and in_place:
        if last_restart is not None:
            return last_restart.model_copy(update={"detail": detail(last_restart.detail, message)})
        # Under the rule only a container's exit != 0 is counted (anything else the kit stops).
        return Cause(kind=CauseKind.NON_ZERO_EXIT, detail=detail("Job", reason, message))
    # BackoffLimitExceeded without a rule (any failed pod), PodFailurePolicy (a disrupted pod):
    # only the pods can say why; the kit looks them up when they are gone.
    return Cause(kind=CauseKind.UNKNOWN, detail=detail("Job", reason, message))


OUTCOME_CONDITIONS: Final = conditions("Complete", "SuccessCriteriaMet", "Failed", "FailureTarget")


class BatchJobKind(HeldBySpecSuspend):
    """The kit's :class:`~dispatch._workload.Kind` for batch/v1 Job."""

    name: Final = BACKEND.name
    resource: Final = RESOURCE
    container: Final = CONTAINER
    create_failure_reason: Final = "FailedCreate"
    kueue_runtime_patch: Final = False
    projection: Final[Mask] = merge(
        SPEC_SUSPEND,
        {"spec": {"backoffLimit": True}, "status": {"conditions": OUTCOME_CONDITIONS, "ready": True}},
    )

    @property
    def capabilities(self) -> Capabilities:
        return BACKEND.capabilities

    def build(self, target: Target, spec: JobSpec, plan: Plan) -> Body:
        return build(target, spec, plan)

    def outcome(self, body: Body, last_restart: Cause | None) -> Outcome | None:
        # SuccessCriteriaMet / FailureTarget come first, while the last pods terminate: the Job
        # controller creates no pod after either (Complete / Failed follow).
        for kind in ("Complete", "SuccessCriteriaMet"):  # in OUTCOME_CONDITIONS
            done = true_condition(body, kind)
            if done is not None:
                return Outcome(Cause(kind=CauseKind.NONE, detail=detail(done.get("message"))), failed=False)
        for kind in ("Failed", "FailureTarget"):
            failed = true_condition(body, kind)
            if failed is not None:
                return Outcome(_failed_cause(dict(failed), self.in_place(body), last_restart), failed=True)
        return None

    def running(self, body: Body) -> bool:
        return int(body.get("status", {}).get("ready") or 0) > 0

    def in_place(self, body: Body) -> bool:
        """Built with the native rule: the Job controller replaces counted pods itself."""
        return int(body.get("spec", {}).get("backoffLimit") or 0) > 0

    def restarts(self, pod: Body) -> int:
        """A pod that failed by itself with exit != 0 is one counted failure (one replacement)."""
        return 1 if failed_exit(pod, CONTAINER) is not None else 0

    def object_restarts(self, body: Body) -> int | None:
        return None  # counted per pod

    def recovers(self, body: Body, cause: Cause) -> bool:
        return cause.kind in RECOVERED


JOB: Final = BatchJobKind()

"""JobSet as a workload kind: one JobSet per (job, submission), named ``<job>-<n>``.

Created with ``spec.suspend: true`` (the JobSet controller creates its child Jobs suspended, so no
pod runs until dispatch releases it). One replicated Job ``node`` (``replicas: 1``) of ``nodes``
pods: ``completions = parallelism = nodes``, Indexed, ``restartPolicy: Never``, ``backoffLimit: 0``,
``podReplacementPolicy: Failed``; every pod template carries dispatch's labels.

The child Job's ``podFailurePolicy`` (kube-controller-manager's pod_failure_policy.go: rules in
order, first match wins, the Job fails with reason ``PodFailurePolicy`` and a message naming the
rule's index):

0. ``FailJob`` on a pod condition ``DisruptionTarget=True`` (preempted, evicted, deleted by the
   taint manager or the pod GC, the kubelet's node shutdown);
1. ``FailJob`` on the training container's exit code ``NotIn [0]``.

The JobSet's ``failurePolicy`` (jobset's failure_policy.go: rules in order, first match wins, no
match means ``RestartJobSet``, hence the last catch-all rule):

- with the plan's scheduler-enforced ``restart`` rule on {non-zero-exit, out-of-memory} and L > 0
  restarts left: ``maxRestarts: L``, rule ``exited`` = ``RestartJobSet`` on a Job failed by rule 1,
  then rule ``other`` = ``FailJobSet``. The (L+1)th exit fails the JobSet (``ReachedMaxRestarts``);
- otherwise ``maxRestarts: 0`` and only ``other`` = ``FailJobSet``: the first failed Job fails the
  JobSet, its pods say why and the supervisor's rules answer it.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Final

from ..._errors import BackendError
from ..._model import Capabilities, Cause, CauseKind, JobSpec, Plan
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
REPLICATED_JOB: Final = "node"
RESOURCE: Final = Resource(**asdict(DECLARED))
RECOVERED: Final = frozenset({CauseKind.NON_ZERO_EXIT, CauseKind.OUT_OF_MEMORY})
"""The causes the JobSet controller answers under the native rule (exit code != 0; OOM is 137)."""
EXIT_RULE_MESSAGE: Final = "matching FailJob rule at index 1"
"""What the Job controller writes in the Failed condition of a Job failed by podFailurePolicy rule 1
(``Container %s for pod %s/%s failed with exit code %v matching %v rule at index %d``)."""
RESTART_ATTEMPT_LABEL: Final = "jobset.sigs.k8s.io/restart-attempt"


def pod_failure_policy() -> Body:
    return {
        "rules": [
            {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            {
                "action": "FailJob",
                "onExitCodes": {"containerName": CONTAINER, "operator": "NotIn", "values": [0]},
            },
        ]
    }


def failure_policy(restarts: int) -> Body:
    rules: list[Body] = [{"name": "other", "action": "FailJobSet"}]
    if restarts > 0:
        exited = {
            "name": "exited",
            "action": "RestartJobSet",
            "onJobFailureReasons": ["PodFailurePolicy"],
            "onJobFailureMessagePatterns": [EXIT_RULE_MESSAGE],
        }
        rules.insert(0, exited)
    return {"maxRestarts": restarts, "rules": rules}


def build(target: Target, spec: JobSpec, plan: Plan) -> Body:
    """The JobSet manifest for ``target``."""
    options = BACKEND.options_of(spec)
    if options is None:
        raise BackendError(
            f"job {target.namespace}/{target.job_name}: the jobset backend needs spec.jobset (the image)"
        )
    check_env(options.env, "spec.jobset.env")
    env = {**options.env, **identity_env(target.namespace, target.job_name, target.submission)}
    budget = restart_budget(plan)
    pod_labels = labels(target.job_name, target.submission)
    job: Body = {
        "completions": spec.nodes,
        "parallelism": spec.nodes,
        "completionMode": "Indexed",
        "backoffLimit": 0,
        "podReplacementPolicy": "Failed",
        "podFailurePolicy": pod_failure_policy(),
        "template": pod_template(
            options,
            container(CONTAINER, options.image, spec, env, options.resources),
            pod_labels,
            restart_policy="Never",
            grace_seconds=pod_grace(spec),
        ),
    }
    body: Body = {
        "apiVersion": RESOURCE.api_version,
        "kind": RESOURCE.kind,
        "metadata": metadata(target, no_capacity_after=options.no_capacity_after_seconds, budget=budget),
        "spec": {
            "suspend": True,
            "failurePolicy": failure_policy(budget or 0),
            "replicatedJobs": [
                {
                    "name": REPLICATED_JOB,
                    "replicas": 1,
                    "template": {"metadata": {"labels": pod_labels}, "spec": job},
                }
            ],
        },
    }
    return check_size(body, "JobSet")


def _failed_cause(condition: Body, last_restart: Cause | None) -> Cause:
    reason = condition.get("reason") or ""
    message = condition.get("message") or ""
    if reason == "ReachedMaxRestarts" and last_restart is not None:
        return last_restart.model_copy(update={"detail": detail(last_restart.detail, message)})
    if reason == "ReachedMaxRestarts":  # only rule 1's Job failures restart it: a container's exit != 0
        return Cause(kind=CauseKind.NON_ZERO_EXIT, detail=detail("JobSet", reason, message))
    # FailJobSetFailurePolicyAction / FailedJobs: which Job failed, not why; the pods say why.
    return Cause(kind=CauseKind.UNKNOWN, detail=detail("JobSet", reason, message))


class JobSetKind(HeldBySpecSuspend):
    """The kit's :class:`~dispatch._workload.Kind` for JobSet."""

    name: Final = BACKEND.name
    resource: Final = RESOURCE
    container: Final = CONTAINER
    create_failure_reason: Final = "JobCreationFailed"
    kueue_runtime_patch: Final = False
    """The JobSet controller's event when it cannot create a child Job (pods are the Jobs' to create:
    their refusals are ``FailedCreate`` events on the child Job)."""
    projection: Final[Mask] = merge(
        SPEC_SUSPEND,
        {
            "spec": {"failurePolicy": {"maxRestarts": True}},
            "status": {
                "conditions": conditions("Completed", "Failed"),
                "restarts": True,
                "replicatedJobsStatus": ({"ready": True, "active": True},),
            },
        },
    )

    @property
    def capabilities(self) -> Capabilities:
        return BACKEND.capabilities

    def build(self, target: Target, spec: JobSpec, plan: Plan) -> Body:
        return build(target, spec, plan)

    def outcome(self, body: Body, last_restart: Cause | None) -> Outcome | None:
        done = true_condition(body, "Completed")
        if done is not None:
            return Outcome(Cause(kind=CauseKind.NONE, detail=detail(done.get("message"))), failed=False)
        failed = true_condition(body, "Failed")
        if failed is not None:
            return Outcome(_failed_cause(dict(failed), last_restart), failed=True)
        return None

    def running(self, body: Body) -> bool:
        jobs = body.get("status", {}).get("replicatedJobsStatus") or []
        return any(int(j.get("ready") or 0) > 0 or int(j.get("active") or 0) > 0 for j in jobs)

    def in_place(self, body: Body) -> bool:
        """Built with the native rule: the JobSet controller restarts it itself."""
        return int((body.get("spec", {}).get("failurePolicy") or {}).get("maxRestarts") or 0) > 0

    def restarts(self, pod: Body) -> int:
        """The failed pod of the training container's exit != 0 (not disrupted, not deleted: the
        Job controller deletes the others when the Job fails) made one restart of the whole JobSet."""
        return 0 if failed_exit(pod, CONTAINER) is None else 1

    def object_restarts(self, body: Body) -> int | None:
        """JobSet counts its restarts itself (``status.restarts``): the restarted attempts' pods
        are deleted, so the pods alone undercount them."""
        return int(body.get("status", {}).get("restarts") or 0)

    def recovers(self, body: Body, cause: Cause) -> bool:
        return cause.kind in RECOVERED


JOBSET: Final = JobSetKind()

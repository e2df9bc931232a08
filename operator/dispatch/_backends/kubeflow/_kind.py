"""PyTorchJob (``kubeflow.org/v1``) as a workload kind: what the kit needs to know about it.

One PyTorchJob per (job, submission), named ``<job>-<n>`` so that a second creator hits
AlreadyExists. It is created suspended (``runPolicy.suspend: true``): the training operator creates
no pods until dispatch releases it. It is built to enforce exactly the rules the plan gives the
scheduler, and nothing else:

- a scheduler-enforced ``restart`` rule on {non-zero-exit, out-of-memory} with L restarts left
  (its budget minus the firings of earlier submissions: the budget belongs to the job, not to each
  object) becomes ``restartPolicy: OnFailure`` and ``runPolicy.backoffLimit: L + 1``. The training
  operator fails the job as soon as the containers' restartCounts reach ``backoffLimit``
  (``PastBackoffLimit``: ``sum >= backoffLimit``), which kills the restart that reached it at once;
  L whole restarts therefore need a limit of L + 1;
- otherwise (no such rule, or nothing left of it) ``restartPolicy: Never`` and no ``backoffLimit``:
  the training operator restarts nothing in place, and keeps the failed pod (see below).

Under ``OnFailure`` the training operator also deletes and recreates a pod that failed for any other
reason (preempted, evicted, its node lost) without counting it toward ``backoffLimit``: that is
not part of the rule, so the kit stops the PyTorchJob as soon as it sees such a cause (see
docs/kubeflow.md, "What the training operator does by itself").

What the API server would refuse only as a whole (a body over its size limit) is refused here with
:class:`~dispatch._workload.Refused`, naming the field: the job ends ``launch-failed`` at once
instead of retrying a create that cannot succeed, and so are env names Kubernetes refuses for pods
while accepting the PyTorchJob (recording env-refused: every pod of it is refused, forever).

``cleanPodPolicy: Running`` deletes the pods still running once the job has finished, and keeps the
failed ones, whose status is the evidence of the cause.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any, Final

from ..._errors import BackendError
from ..._model import Capabilities, Cause, CauseKind, JobSpec, Plan
from ..._workload import (
    SHARED,
    Body,
    Mask,
    Outcome,
    Resource,
    Target,
    check_env,
    check_size,
    conditions,
    container,
    container_restarts,
    detail,
    labels,
    metadata,
    restart_budget,
    true_condition,
)
from .._kit import identity_env, pod_grace, pod_template
from . import BACKEND
from . import RESOURCE as DECLARED

PYTORCH_CONTAINER: Final = "pytorch"
"""The training operator's default container of a PyTorchJob (the one it gives the rendezvous
environment): the one whose state is the evidence."""
RESTART_ON_FAILURE: Final = "OnFailure"
RESTART_NEVER: Final = "Never"
CLEAN_POD_POLICY: Final = "Running"
RESOURCE: Final = Resource(**asdict(DECLARED))


def build(target: Target, spec: JobSpec, plan: Plan) -> Body:
    """The PyTorchJob manifest for ``target``."""
    options = BACKEND.options_of(spec)
    if options is None:
        raise BackendError(
            f"job {target.namespace}/{target.job_name}: the kubeflow backend needs spec.kubeflow (the image)"
        )
    check_env(options.env, "spec.kubeflow.env")
    budget = restart_budget(plan)
    run_policy: Body = {"suspend": True, "cleanPodPolicy": CLEAN_POD_POLICY}
    if budget:
        restart_policy = RESTART_ON_FAILURE
        run_policy["backoffLimit"] = budget + 1
    else:
        # No backoffLimit at all: with one (even 0) the training operator fails the job on its
        # first failed pod by its requeue count ("reached the specified backoff limit") and deletes
        # every pod, the failed one too; without, it fails it by replica accounting ("N replica(s)
        # failed") and cleanPodPolicy Running keeps the failed pod, whose status says why.
        restart_policy = RESTART_NEVER
    tags = labels(target.job_name, target.submission)
    env = {**options.env, **identity_env(target.namespace, target.job_name, target.submission)}
    template = pod_template(
        options,
        container(PYTORCH_CONTAINER, options.image, spec, env, options.resources),
        tags,
        grace_seconds=pod_grace(spec),
    )

    def replica(count: int) -> Body:
        return {"replicas": count, "restartPolicy": restart_policy, "template": copy.deepcopy(template)}

    replicas: Body = {"Master": replica(1)}
    if spec.nodes > 1:
        replicas["Worker"] = replica(spec.nodes - 1)
    body: Body = {
        "apiVersion": RESOURCE.api_version,
        "kind": RESOURCE.kind,
        "metadata": metadata(target, no_capacity_after=options.no_capacity_after_seconds, budget=budget),
        "spec": {"runPolicy": run_policy, "pytorchReplicaSpecs": replicas},
    }
    return check_size(body, RESOURCE.kind)


def _failed_cause(condition: Mapping[str, Any], last_restart: Cause | None) -> Cause:
    message = condition.get("message") or ""
    lowered = message.lower()
    if "deadline" in lowered:
        return Cause(kind=CauseKind.TIME_LIMIT, detail=detail("PyTorchJob", message))
    if "backoff limit" in lowered:
        if last_restart is not None:
            return last_restart.model_copy(update={"detail": detail(last_restart.detail, message)})
        # Only failing containers are restarted under OnFailure and counted against backoffLimit.
        return Cause(kind=CauseKind.NON_ZERO_EXIT, detail=detail("PyTorchJob", message))
    return Cause(kind=CauseKind.UNKNOWN, detail=detail("PyTorchJob", condition.get("reason"), message))


class PyTorchJobKind:
    """The kit's :class:`~dispatch._workload.Kind` for Kubeflow's PyTorchJob v1."""

    name: Final = BACKEND.name
    resource: Final = RESOURCE
    container: Final = PYTORCH_CONTAINER
    create_failure_reason: Final = "FailedCreatePod"
    kueue_runtime_patch: Final = False
    projection: Final[Mask] = {
        "spec": {
            "runPolicy": {"suspend": True},
            "pytorchReplicaSpecs": {"Master": {"restartPolicy": SHARED}},
        },
        "status": {"conditions": conditions("Succeeded", "Failed", "Running")},
    }

    @property
    def capabilities(self) -> Capabilities:
        return BACKEND.capabilities

    def build(self, target: Target, spec: JobSpec, plan: Plan) -> Body:
        return build(target, spec, plan)

    def suspended(self, body: Body) -> bool:
        return bool((body.get("spec", {}).get("runPolicy") or {}).get("suspend"))

    def suspend_patch(self, suspend: bool) -> Body:
        return {"spec": {"runPolicy": {"suspend": suspend}}}

    def outcome(self, body: Body, last_restart: Cause | None) -> Outcome | None:
        succeeded = true_condition(body, "Succeeded")
        if succeeded is not None:
            return Outcome(Cause(kind=CauseKind.NONE, detail=detail(succeeded.get("message"))), failed=False)
        failed = true_condition(body, "Failed")
        if failed is not None:
            return Outcome(_failed_cause(failed, last_restart), failed=True)
        return None

    def running(self, body: Body) -> bool:
        return true_condition(body, "Running") is not None

    def in_place(self, body: Body) -> bool:
        """Built to restart failed containers in place (a scheduler-enforced restart rule)."""
        replicas = body.get("spec", {}).get("pytorchReplicaSpecs", {}) or {}
        master = replicas.get("Master") or {}
        return master.get("restartPolicy") in ("OnFailure", "Always")

    def restarts(self, pod: Body) -> int:
        return container_restarts(pod, PYTORCH_CONTAINER)

    def object_restarts(self, body: Body) -> int | None:
        return None  # counted per pod

    def recovers(self, body: Body, cause: Cause) -> bool:
        # The kubelet restarts the container in place (seen by pod_evidence), never a failed pod.
        return False

    def pod_prefixes(self, body: Body) -> tuple[str, ...]:
        name = body.get("metadata", {}).get("name", "")
        return (f"{name}-master-", f"{name}-worker-")


PYTORCHJOB: Final = PyTorchJobKind()

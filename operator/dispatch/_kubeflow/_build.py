"""The PyTorchJob dispatch creates for one submission of a job.

One PyTorchJob per (job, submission), named ``<job>-<n>`` so that a second creator hits
AlreadyExists. It is created suspended (``runPolicy.suspend: true``): the training operator creates
no pods until dispatch releases it. It is built to enforce exactly the rules the plan gives the
scheduler, and nothing else:

- a scheduler-enforced ``restart`` rule on {non-zero-exit, out-of-memory} with budget B becomes
  ``restartPolicy: OnFailure`` and ``runPolicy.backoffLimit: B + 1``. The training operator fails
  the job as soon as the containers' restartCounts reach ``backoffLimit``
  (``PastBackoffLimit``: ``sum >= backoffLimit``), which kills the restart that reached it at once;
  B whole restarts therefore need a limit of B + 1 (and B = 0 behaves as the operator's 0: the first
  failure ends the job);
- otherwise ``restartPolicy: Never`` and ``backoffLimit: 0``: the training operator never retries
  what dispatch supervises.

``cleanPodPolicy: Running`` deletes the pods still running once the job has finished, and keeps the
failed ones, whose status is the evidence of the cause.
"""

from __future__ import annotations

from typing import Any, Final

from .._constants import (
    ANNOTATION_NO_CAPACITY_AFTER,
    ANNOTATION_RESTART_BUDGET,
    API_VERSION,
    GPU_RESOURCE,
    KIND,
    KUBEFLOW_GROUP,
    KUBEFLOW_VERSION,
    LABEL_JOB,
    LABEL_MANAGED_BY,
    LABEL_SUBMISSION,
    MANAGED_BY,
    PYTORCH_CONTAINER,
    PYTORCHJOB_KIND,
)
from .._errors import BackendError
from .._model import Action, Enforcer, JobSpec, KubeflowOptions, Plan

Body = dict[str, Any]

RESTART_ON_FAILURE: Final = "OnFailure"
RESTART_NEVER: Final = "Never"
CLEAN_POD_POLICY: Final = "Running"


def object_name(job_name: str, submission: int) -> str:
    return f"{job_name}-{submission}"


def labels(job_name: str, submission: int) -> dict[str, str]:
    return {LABEL_JOB: job_name, LABEL_SUBMISSION: str(submission), LABEL_MANAGED_BY: MANAGED_BY}


def restart_budget(plan: Plan) -> int | None:
    """The budget of the plan's scheduler-enforced restart rule, or None when it has none."""
    budgets = [
        rule.budget
        for rule in plan.rules
        if rule.enforcer is Enforcer.SCHEDULER and rule.action is Action.RESTART
    ]
    if len(budgets) > 1:  # the capabilities declare one native rule; a plan cannot hold two
        raise BackendError("the plan gives the scheduler more than one restart rule; Kubeflow enforces one")
    return budgets[0] if budgets else None


def build(
    *,
    namespace: str,
    job_name: str,
    submission: int,
    spec: JobSpec,
    plan: Plan,
    owner_uid: str,
) -> Body:
    """The PyTorchJob manifest for submission ``submission`` of the DispatchJob ``namespace/job_name``."""
    options = spec.kubeflow
    if options is None:
        raise BackendError(
            f"job {namespace}/{job_name}: the kubeflow backend needs spec.kubeflow (the image)"
        )
    budget = restart_budget(plan)
    tags = labels(job_name, submission)
    annotations = {ANNOTATION_NO_CAPACITY_AFTER: str(options.no_capacity_after_seconds)}
    if budget is not None:
        annotations[ANNOTATION_RESTART_BUDGET] = str(budget)
        restart_policy, backoff_limit = RESTART_ON_FAILURE, budget + 1
    else:
        restart_policy, backoff_limit = RESTART_NEVER, 0
    replicas: Body = {"Master": _replica(1, restart_policy, tags, spec, options)}
    if spec.nodes > 1:
        replicas["Worker"] = _replica(spec.nodes - 1, restart_policy, tags, spec, options)
    return {
        "apiVersion": f"{KUBEFLOW_GROUP}/{KUBEFLOW_VERSION}",
        "kind": PYTORCHJOB_KIND,
        "metadata": {
            "name": object_name(job_name, submission),
            "namespace": namespace,
            "labels": tags,
            "annotations": annotations,
            "ownerReferences": [
                {
                    "apiVersion": API_VERSION,
                    "kind": KIND,
                    "name": job_name,
                    "uid": owner_uid,
                    "controller": True,
                }
            ],
        },
        "spec": {
            "runPolicy": {
                "suspend": True,
                "backoffLimit": backoff_limit,
                "cleanPodPolicy": CLEAN_POD_POLICY,
            },
            "pytorchReplicaSpecs": replicas,
        },
    }


def _replica(
    count: int, restart_policy: str, tags: dict[str, str], spec: JobSpec, options: KubeflowOptions
) -> Body:
    container: Body = {
        "name": PYTORCH_CONTAINER,
        "image": options.image,
        "command": list(spec.command),
    }
    if options.env:
        container["env"] = [{"name": k, "value": v} for k, v in sorted(options.env.items())]
    resources = _resources(options)
    if resources:
        container["resources"] = resources
    return {
        "replicas": count,
        "restartPolicy": restart_policy,
        "template": {
            "metadata": {"labels": dict(tags)},
            "spec": {"containers": [container]},
        },
    }


def _resources(options: KubeflowOptions) -> Body:
    res = options.resources
    requests: dict[str, str] = {}
    if res.cpu is not None:
        requests["cpu"] = res.cpu
    if res.memory is not None:
        requests["memory"] = res.memory
    limits = dict(requests)
    if res.gpu:
        limits[GPU_RESOURCE] = str(res.gpu)
    out: Body = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out

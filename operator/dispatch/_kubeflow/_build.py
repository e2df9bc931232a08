"""The PyTorchJob dispatch creates for one submission of a job.

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
not part of the rule, so the adapter stops the PyTorchJob as soon as it sees such a cause (see
docs/kubeflow.md, "What the training operator does by itself").

What the API server would refuse only as a whole (a body over its size limit) is refused here with
:class:`Refused`, naming the field: the job ends ``launch-failed`` at once instead of retrying a
create that cannot succeed, and so are env names Kubernetes refuses for pods while accepting the
PyTorchJob (recording env-refused: every pod of it is refused, forever).

``cleanPodPolicy: Running`` deletes the pods still running once the job has finished, and keeps the
failed ones, whose status is the evidence of the cause.
"""

from __future__ import annotations

import json
import re
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
    OBJECT_FINALIZER,
    PYTORCH_CONTAINER,
    PYTORCHJOB_KIND,
)
from .._errors import BackendError
from .._model import Action, Enforcer, JobSpec, KubeflowOptions, Plan

Body = dict[str, Any]

RESTART_ON_FAILURE: Final = "OnFailure"
RESTART_NEVER: Final = "Never"
CLEAN_POD_POLICY: Final = "Running"
MAX_OBJECT_BYTES: Final = 1_500_000
"""Below etcd's default request limit (1.5 MiB) with room for the status the training operator adds:
a bigger PyTorchJob is refused by the API server, and its pods (each a copy of a template) too."""


ENV_NAME: Final = re.compile(r"[\x20-\x3c\x3e-\x7e]+")
"""Kubernetes' rule for a container env name since 1.32 (IsRelaxedEnvVarName): printable ASCII,
no '='."""


class Refused(BackendError):
    """This submission can never become a running PyTorchJob; ``field`` names what to change."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


def object_name(job_name: str, submission: int) -> str:
    return f"{job_name}-{submission}"


def labels(job_name: str, submission: int) -> dict[str, str]:
    return {LABEL_JOB: job_name, LABEL_SUBMISSION: str(submission), LABEL_MANAGED_BY: MANAGED_BY}


def restart_budget(plan: Plan) -> int | None:
    """What is left of the plan's scheduler-enforced restart rule (budget minus firings so far), or
    None when it has none."""
    budgets = [
        rule.left
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
    for key in sorted(options.env):
        if not ENV_NAME.fullmatch(key):
            raise Refused(
                f"spec.kubeflow.env[{key!r}]",
                "Kubernetes refuses this env name for a container (printable ASCII without '=')",
            )
    budget = restart_budget(plan)
    tags = labels(job_name, submission)
    annotations = {ANNOTATION_NO_CAPACITY_AFTER: str(options.no_capacity_after_seconds)}
    if budget is not None:
        annotations[ANNOTATION_RESTART_BUDGET] = str(budget)
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
    replicas: Body = {"Master": _replica(1, restart_policy, tags, spec, options)}
    if spec.nodes > 1:
        replicas["Worker"] = _replica(spec.nodes - 1, restart_policy, tags, spec, options)
    body: Body = {
        "apiVersion": f"{KUBEFLOW_GROUP}/{KUBEFLOW_VERSION}",
        "kind": PYTORCHJOB_KIND,
        "metadata": {
            "name": object_name(job_name, submission),
            "namespace": namespace,
            "labels": tags,
            "annotations": annotations,
            "finalizers": [OBJECT_FINALIZER],
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
            "runPolicy": run_policy,
            "pytorchReplicaSpecs": replicas,
        },
    }
    size = len(json.dumps(body, separators=(",", ":")))
    if size > MAX_OBJECT_BYTES:
        raise Refused(
            "spec",
            f"the PyTorchJob would be {size} bytes, over the API server's limit of about "
            f"{MAX_OBJECT_BYTES} bytes (command and env are copied into each replica's template)",
        )
    return body


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

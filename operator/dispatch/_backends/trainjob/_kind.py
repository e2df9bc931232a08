"""TrainJob (Kubeflow Trainer v2) as a workload kind: one TrainJob per (job, submission), named
``<job>-<n>``.

Created with ``spec.suspend: true``: the Trainer builds the JobSet (same name) from the runtime
suspended, and JobSet its child Jobs, so no pod runs until dispatch releases the TrainJob. The spec
names the options' runtime (``runtimeRef``), ``trainer.numNodes`` = nodes, the job's command, and the
options' image (else the runtime's), env and ``resourcesPerNode``. A ``runtimePatches`` entry
(manager ``dispatch.dev/dispatch``) puts dispatch's labels on the pod template of the runtime's
trainer Job, by which the kit finds the pods, and the pod options the Trainer's ``PodSpecPatch``
carries (volumes and the trainer container's mounts, node selector, tolerations, affinity, service
account, image pull secrets, pod labels and annotations); the options refuse the others at apply.

No native rule (see ``dispatch._backends.trainjob``): the first failed pod is the end of the
submission (the kit stops the TrainJob by suspending it), whatever the runtime's Jobs would retry.
The causes come from the pods; the TrainJob's own ``Failed`` condition adds only a deadline
(``DeadlineExceeded``, ``spec.activeDeadlineSeconds``) or a runtime it cannot use.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Final, cast

from ..._constants import RUNTIME_PATCH_MANAGER
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
    labels,
    merge,
    metadata,
    true_condition,
)
from .._kit import (
    container_security_context,
    identity_env,
    pod_metadata,
    pod_spec_fields,
    value_from_env,
    volume_mounts,
)
from . import BACKEND
from . import RESOURCE as DECLARED

CONTAINER: Final = "node"
"""The trainer's container in the upstream runtimes (the one the Trainer sets image and command of)."""
RESOURCE: Final = Resource(**asdict(DECLARED))


def build(target: Target, spec: JobSpec, plan: Plan) -> Body:
    """The TrainJob manifest for ``target``."""
    options = BACKEND.options_of(spec)
    if options is None:
        raise BackendError(
            f"job {target.namespace}/{target.job_name}: the trainjob backend needs spec.trainjob "
            "(the runtime)"
        )
    check_env(options.env, "spec.trainjob.env")
    # The kit's container(): the job's command, env and the requests/limits of a node.
    env = {**options.env, **identity_env(target.namespace, target.job_name, target.submission)}
    main = container(CONTAINER, options.image or "", spec, env, options.resources)
    trainer: Body = {"numNodes": spec.nodes, "command": main["command"]}
    if options.image:
        trainer["image"] = options.image
    env_list = [*cast(list[Body], main.get("env", [])), *value_from_env(options)]
    if env_list:
        trainer["env"] = env_list
    if "resources" in main:
        trainer["resourcesPerNode"] = main["resources"]
    # The pod options a runtime patch carries (Trainer's PodSpecPatch; the options model refuses
    # the others at apply): the pod's fields, and the trainer container's mounts (its env goes
    # through spec.trainer, the only way the Trainer takes the env of its container).
    pod_spec: Body = dict(pod_spec_fields(options))
    box: Body = {"name": CONTAINER, "securityContext": container_security_context(options)}
    mounts = volume_mounts(options)
    if mounts:
        box["volumeMounts"] = mounts
    pod_spec["containers"] = [box]
    pod: Body = {"metadata": pod_metadata(options, labels(target.job_name, target.submission))}
    if pod_spec:
        pod["spec"] = pod_spec
    patch: Body = {
        "manager": RUNTIME_PATCH_MANAGER,
        "trainingRuntimeSpec": {
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": options.trainer_job,
                            "template": {"spec": {"template": pod}},
                        }
                    ]
                }
            }
        },
    }
    body: Body = {
        "apiVersion": RESOURCE.api_version,
        "kind": RESOURCE.kind,
        "metadata": metadata(target, no_capacity_after=options.no_capacity_after_seconds, budget=None),
        "spec": {
            "suspend": True,
            "runtimeRef": {
                "apiGroup": RESOURCE.group,
                "kind": options.runtime_kind,
                "name": options.runtime,
            },
            "trainer": trainer,
            "runtimePatches": [patch],
        },
    }
    return check_size(body, "TrainJob")


class TrainJobKind(HeldBySpecSuspend):
    """The kit's :class:`~dispatch._workload.Kind` for TrainJob."""

    name: Final = BACKEND.name
    resource: Final = RESOURCE
    container: Final = CONTAINER
    create_failure_reason: Final = "TrainJobResourcesCreationFailed"
    kueue_runtime_patch: Final = True
    """The Trainer's Warning event when it cannot build the TrainJob's objects (trainjob_controller.go)."""
    projection: Final[Mask] = merge(
        SPEC_SUSPEND,
        {
            "status": {
                "conditions": conditions("Complete", "Failed"),
                "jobsStatus": ({"ready": True, "active": True},),
            }
        },
    )

    @property
    def capabilities(self) -> Capabilities:
        return BACKEND.capabilities

    def build(self, target: Target, spec: JobSpec, plan: Plan) -> Body:
        return build(target, spec, plan)

    def outcome(self, body: Body, last_restart: Cause | None) -> Outcome | None:
        done = true_condition(body, "Complete")
        if done is not None:
            return Outcome(Cause(kind=CauseKind.NONE, detail=detail(done.get("message"))), failed=False)
        failed = true_condition(body, "Failed")
        if failed is None:
            return None
        reason, message = failed.get("reason") or "", failed.get("message") or ""
        kind = CauseKind.TIME_LIMIT if reason == "DeadlineExceeded" else CauseKind.UNKNOWN
        if reason == "TrainingRuntimeNotSupported":
            kind = CauseKind.LAUNCH_FAILED
        return Outcome(Cause(kind=kind, detail=detail("TrainJob", reason, message)), failed=True)

    def running(self, body: Body) -> bool:
        jobs = body.get("status", {}).get("jobsStatus") or []
        return any(int(j.get("ready") or 0) > 0 or int(j.get("active") or 0) > 0 for j in jobs)

    def in_place(self, body: Body) -> bool:
        return False

    def restarts(self, pod: Body) -> int:
        return 0

    def object_restarts(self, body: Body) -> int | None:
        return None

    def recovers(self, body: Body, cause: Cause) -> bool:
        return False


TRAINJOB: Final = TrainJobKind()

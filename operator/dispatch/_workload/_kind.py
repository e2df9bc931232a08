"""The per-kind protocol: what the workload kit needs to know about one Kubernetes workload kind.

The kit (:class:`~dispatch._workload.WorkloadBackend`) owns everything every kind shares: the
watches and their cache, our own writes until the watch shows them, tombstones, the fence, stopping
by suspend, pod evidence, events and cause classification. A kind says only what differs: where its
objects live, how one is built from a job's spec, how it is held and released, and how its own
status reports success, failure and in-place restarts. See docs/backends.md, "The kit's API".
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol, runtime_checkable

from .._constants import (
    ANNOTATION_NO_CAPACITY_AFTER,
    ANNOTATION_RESTART_BUDGET,
    GPU_RESOURCE,
    LABEL_JOB,
    LABEL_MANAGED_BY,
    LABEL_SUBMISSION,
    MANAGED_BY,
    OBJECT_FINALIZER,
)
from .._errors import BackendError
from .._model import Action, Capabilities, Cause, Enforcer, JobSpec, Plan, Resources
from ._mask import Body, Mask

MAX_OBJECT_BYTES: Final = 1_500_000
"""Below etcd's default request limit (1.5 MiB) with room for the status a controller adds: a bigger
object is refused by the API server, and its pods (each a copy of a template) too."""
ENV_NAME: Final = re.compile(r"[\x20-\x3c\x3e-\x7e]+")
"""Kubernetes' rule for a container env name since 1.32 (IsRelaxedEnvVarName): printable ASCII,
no '='."""


class Refused(BackendError):
    """This submission can never become a running object; ``field`` names what to change."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


@dataclass(frozen=True, slots=True)
class Resource:
    """Where a kind's objects live on the API server."""

    group: str
    """API group; ``""`` for the core group."""
    version: str
    plural: str
    kind: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None, name: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        path = f"{base}/namespaces/{namespace}/{self.plural}" if namespace else f"{base}/{self.plural}"
        return f"{path}/{name}" if name else path

    def __str__(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


@dataclass(frozen=True, slots=True)
class Target:
    """The object to build: submission ``submission`` of job ``namespace/job_name``."""

    namespace: str
    job_name: str
    submission: int
    owner: Mapping[str, Any] | None = None
    """The ownerReference to put on it (the DispatchJob), or None when used as a library."""

    @property
    def name(self) -> str:
        return object_name(self.job_name, self.submission)

    @property
    def id(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a kind's own status says about its end: finished for good, with this cause."""

    cause: Cause
    """``none`` for success; for a failure, the cause the object's status alone gives (the pods'
    evidence, when there is some, is more precise and wins)."""
    failed: bool


@runtime_checkable
class Kind(Protocol):
    """One workload kind on the kit. Every method is pure (no I/O) and cheap: called per event."""

    @property
    def name(self) -> str:
        """The backend's name (``spec.backend``), also used in logs and task names."""
        ...

    @property
    def resource(self) -> Resource: ...

    @property
    def capabilities(self) -> Capabilities:
        """What its controller enforces natively and exactly (the plan gives it those rules)."""
        ...

    @property
    def container(self) -> str:
        """The name of the container whose state is the evidence (else a pod's first container)."""
        ...

    @property
    def create_failure_reason(self) -> str:
        """The reason of the Event its controller writes on the object when the API server refuses
        the pods it creates (``FailedCreatePod``, ``FailedCreate``)."""
        ...

    @property
    def kueue_runtime_patch(self) -> bool:
        """Kueue starts an object of this kind only once its own entry is in ``spec.runtimePatches``
        (its mutating webhook adds it at creation): where the webhook does not run, the release of a
        queued object adds it, from a fresh read of the whole object (a merge patch replaces the
        list, and the cache keeps only a projection)."""
        ...

    @property
    def projection(self) -> Mask:
        """Every field of ``spec`` and ``status`` the methods below read from an object (its suspend
        field, its terminal conditions, its restart settings): the kit caches an object as this
        plus the metadata it reads itself, never the whole body, so a field read but not declared
        here is absent (tests/unit/test_projection.py compares both on every recorded event)."""
        ...

    def build(self, target: Target, spec: JobSpec, plan: Plan) -> Body:
        """The manifest, created held (it cannot start), metadata from :func:`metadata`. Raise
        :class:`Refused` for a spec that can never run; :class:`~dispatch.BackendError` for a job
        that lacks this backend's options."""
        ...

    def suspended(self, body: Body) -> bool:
        """Held: the spec says suspend, so its controller runs nothing."""
        ...

    def suspend_patch(self, suspend: bool) -> Body:
        """The merge patch (spec part) that holds (True) or releases (False) the object."""
        ...

    def outcome(self, body: Body, last_restart: Cause | None) -> Outcome | None:
        """Finished by its controller for good (its terminal conditions), or None. ``last_restart``:
        the cause of the latest in-place restart seen, for a failure that says only "backoff limit"."""
        ...

    def running(self, body: Body) -> bool:
        """Its status says it runs (the kit also counts a running pod as running)."""
        ...

    def in_place(self, body: Body) -> bool:
        """Built to let its controller restart failed pods itself under a native rule: their
        failures are restarts (counted in ``restarts``), not the end of the object."""
        ...

    def restarts(self, pod: Body) -> int:
        """How many in-place restarts this pod stands for (read only when :meth:`in_place`)."""
        ...

    def object_restarts(self, body: Body) -> int | None:
        """The object's own count of the in-place restarts it made (a status field such as
        ``status.restarts``), when it keeps one; None: the kit sums :meth:`restarts` over the pods
        it has seen."""
        ...

    def recovers(self, body: Body, cause: Cause) -> bool:
        """Its controller answers a pod that ended with ``cause`` by itself as the native rule says
        (a restart, not the end): only when :meth:`in_place`."""
        ...

    def pod_prefixes(self, body: Body) -> tuple[str, ...]:
        """Name prefixes of its pods, to match Events that outlive them."""
        ...


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
        raise BackendError("the plan gives the scheduler more than one restart rule; a kind enforces one")
    return budgets[0] if budgets else None


def metadata(target: Target, *, no_capacity_after: int, budget: int | None) -> Body:
    """The metadata every kit object carries: its name, dispatch's labels (the pods' templates
    carry them too), the thresholds the classification reads back, the finalizer, the owner."""
    annotations = {ANNOTATION_NO_CAPACITY_AFTER: str(no_capacity_after)}
    if budget is not None:
        annotations[ANNOTATION_RESTART_BUDGET] = str(budget)
    meta: Body = {
        "name": target.name,
        "namespace": target.namespace,
        "labels": labels(target.job_name, target.submission),
        "annotations": annotations,
        "finalizers": [OBJECT_FINALIZER],
    }
    if target.owner is not None:
        meta["ownerReferences"] = [dict(target.owner)]
    return meta


def check_env(env: Mapping[str, str], field: str) -> None:
    for key in sorted(env):
        if not ENV_NAME.fullmatch(key):
            raise Refused(
                f"{field}[{key!r}]",
                "Kubernetes refuses this env name for a container (printable ASCII without '=')",
            )


def container(name: str, image: str, spec: JobSpec, env: Mapping[str, str], res: Resources) -> Body:
    """The one container of a training pod: the image, the job's command, env and resources."""
    out: Body = {"name": name, "image": image, "command": list(spec.command)}
    if env:
        out["env"] = [{"name": k, "value": v} for k, v in sorted(env.items())]
    requests: dict[str, str] = {}
    if res.cpu is not None:
        requests["cpu"] = res.cpu
    if res.memory is not None:
        requests["memory"] = res.memory
    limits = dict(requests)
    if res.gpu:
        limits[GPU_RESOURCE] = str(res.gpu)
    resources: Body = {}
    if requests:
        resources["requests"] = requests
    if limits:
        resources["limits"] = limits
    if resources:
        out["resources"] = resources
    return out


def check_size(body: Body, noun: str) -> Body:
    size = len(json.dumps(body, separators=(",", ":")))
    if size > MAX_OBJECT_BYTES:
        raise Refused(
            "spec",
            f"the {noun} would be {size} bytes, over the API server's limit of about "
            f"{MAX_OBJECT_BYTES} bytes (command and env are copied into each pod template)",
        )
    return body


SPEC_SUSPEND: Final[Mask] = {"spec": {"suspend": True}}
"""What :class:`HeldBySpecSuspend` reads: merge it into the kind's projection."""


class HeldBySpecSuspend:
    """Defaults for a kind held by ``spec.suspend`` whose pods are named ``<object name>-...``: mix
    in and define the rest of :class:`Kind` (its projection merged with :data:`SPEC_SUSPEND`)."""

    def suspended(self, body: Body) -> bool:
        return bool(body.get("spec", {}).get("suspend"))

    def suspend_patch(self, suspend: bool) -> Body:
        return {"spec": {"suspend": suspend}}

    def pod_prefixes(self, body: Body) -> tuple[str, ...]:
        return (f"{body.get('metadata', {}).get('name', '')}-",)


def failed_exit(pod: Mapping[str, Any], container: str) -> int | None:
    """The exit code of ``container`` when the pod failed by itself with it != 0: not disrupted
    (``DisruptionTarget``), not being deleted. What a Job controller counts as a failure of the
    training process, under ``restartPolicy: Never``; None otherwise."""
    status = pod.get("status", {})
    if status.get("phase") != "Failed" or pod.get("metadata", {}).get("deletionTimestamp"):
        return None
    for condition in status.get("conditions") or []:
        if condition.get("type") == "DisruptionTarget" and condition.get("status") == "True":
            return None
    for state in status.get("containerStatuses") or []:
        if state.get("name") == container:
            code = ((state.get("state") or {}).get("terminated") or {}).get("exitCode")
            return code if isinstance(code, int) and code != 0 else None
    return None

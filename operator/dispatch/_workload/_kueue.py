"""Kueue in front: a queued object's release, stop and verdict, and the shared Workload watch.

A job with ``spec.queue`` has each submission's object created held as any other (suspended, and
without Kueue's ``kueue.x-k8s.io/queue-name`` label, so Kueue does not manage it: Kueue reconciles
only objects carrying the label while ``manageJobsWithoutQueueName`` is false). The LocalQueue is
kept in dispatch's own annotation until the release, which is one patch adding Kueue's labels and
``dispatch.dev/released`` and leaving ``suspend`` true: Kueue then creates the object's Workload,
admits it within its quota and unsuspends the object itself. The release is made only once the
record names the object canonical, so no object Kueue could start exists before that.

Kueue's verdicts are read from the object's Workload (found by its ownerReference's uid), by one
list+watch of Workloads shared by every kit backend of a process, kept as a slim
:class:`WorkloadView`. Stopping a queued object removes Kueue's label in the same patch as the
suspend (Kueue would otherwise unsuspend a suspended object whose Workload it has admitted,
jobframework's reconciler, step 7) and then deletes the object, which deletes its Workload (owned
by it): that is what stops Kueue's own requeue of an evicted workload. dispatch's finalizer keeps
the object until the record has its cause. See docs/kueue.md for the table of conditions read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final

from .. import _registry
from .._constants import (
    ANNOTATION_PRIORITY_CLASS,
    ANNOTATION_QUEUE,
    ANNOTATION_RELEASED,
    KUEUE_GROUP,
    KUEUE_LABEL_PRIORITY_CLASS,
    KUEUE_LABEL_QUEUE,
    KUEUE_VERSION,
)
from .._errors import BackendError
from .._kubeclient import Client, Informer, KubeError, request
from .._model import Cause, CauseKind, JobSpec, Phase
from ._fields import detail, parse_time
from ._kind import Kind, Resource
from ._mask import Body, Clip, Mask, conditions, project
from ._requests import explain

log = logging.getLogger("dispatch.kueue")

WORKLOADS: Final = Resource(KUEUE_GROUP, KUEUE_VERSION, "workloads", "Workload")

# Workload conditions and reasons (sigs.k8s.io/kueue apis/kueue/v1beta2/workload_types.go).
COND_QUOTA_RESERVED: Final = "QuotaReserved"
COND_ADMITTED: Final = "Admitted"
COND_EVICTED: Final = "Evicted"
COND_PREEMPTED: Final = "Preempted"
COND_FINISHED: Final = "Finished"
EVICTED_BY_PREEMPTION: Final = "Preempted"
EVICTED_BY_PODS_READY_TIMEOUT: Final = "PodsReadyTimeout"
EVICTED_BY_DEACTIVATION: Final = "Deactivated"
EVICTED_BY_NODE_FAILURES: Final = "NodeFailures"
PREEMPTION_REASONS: Final = frozenset(
    {"InClusterQueue", "InCohortReclamation", "InCohortFairSharing", "InCohortReclaimWhileBorrowing"}
)
"""The Preempted condition's reasons: in the ClusterQueue by priority, in the cohort by reclamation,
by fair sharing, or by reclamation while borrowing. Each makes the eviction ``preempted``."""
_MAX_DETAIL: Final = 1024


@dataclass(frozen=True, slots=True)
class Condition:
    status: bool
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class WorkloadView:
    """What dispatch keeps of one Workload: its owner, whether it is active, its conditions of
    interest and its eviction counts (``status.schedulingStats.evictions``, which outlive a
    re-admission and an operator's restart)."""

    namespace: str
    name: str
    owner_kind: str
    owner_name: str
    owner_uid: str
    resource_version: str
    queue: str = ""
    active: bool = True
    conditions: Mapping[str, Condition] = field(default_factory=dict)
    evictions: tuple[tuple[str, str, int], ...] = ()
    """(reason, underlyingCause, count) of each kind of eviction so far."""

    def condition(self, kind: str) -> Condition | None:
        return self.conditions.get(kind)

    def true(self, kind: str) -> Condition | None:
        found = self.conditions.get(kind)
        return found if found is not None and found.status else None


_KEPT_CONDITIONS: Final = frozenset(
    {COND_QUOTA_RESERVED, COND_ADMITTED, COND_EVICTED, COND_PREEMPTED, COND_FINISHED}
)


WORKLOAD_MASK: Final[Mask] = {
    "metadata": {
        "name": True,
        "namespace": True,
        "resourceVersion": True,
        "ownerReferences": ({"kind": True, "name": True, "uid": True, "controller": True},),
    },
    "spec": {"queueName": True, "active": True},
    "status": {
        "conditions": conditions(
            *_KEPT_CONDITIONS,
            mask={"type": True, "status": True, "reason": True, "message": Clip(_MAX_DETAIL)},
        ),
        "schedulingStats": {"evictions": ({"reason": True, "underlyingCause": True, "count": True},)},
    },
}
"""What the shared watch keeps of a Workload (its Informer's store): what :func:`workload_view`
reads, nothing of its pod sets, admission or resource usage."""


def project_workload(body: Body) -> Body:
    kept: Body = project(body, WORKLOAD_MASK)
    return kept


def workload_view(body: Mapping[str, Any]) -> WorkloadView | None:
    """The slim view of a Workload, or None for one without a controlling owner (not a job's)."""
    meta = body.get("metadata") or {}
    owner = next((o for o in meta.get("ownerReferences") or () if o.get("controller")), None)
    if owner is None or not owner.get("uid"):
        return None
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    conditions = {
        str(c.get("type")): Condition(
            c.get("status") == "True", str(c.get("reason") or ""), str(c.get("message") or "")[:_MAX_DETAIL]
        )
        for c in status.get("conditions") or ()
        if c.get("type") in _KEPT_CONDITIONS
    }
    evictions = tuple(
        (str(e.get("reason") or ""), str(e.get("underlyingCause") or ""), int(e.get("count") or 0))
        for e in (status.get("schedulingStats") or {}).get("evictions") or ()
    )
    return WorkloadView(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        owner_kind=str(owner.get("kind") or ""),
        owner_name=str(owner.get("name") or ""),
        owner_uid=str(owner["uid"]),
        resource_version=str(meta.get("resourceVersion") or ""),
        queue=str(spec.get("queueName") or ""),
        active=spec.get("active") is not False,
        conditions=conditions,
        evictions=evictions,
    )


# ---- the object's side: held, released, stopped ------------------------------------------------------


def queue_of(body: Mapping[str, Any]) -> str | None:
    """The LocalQueue a queued object is (or will be) released into; None for an unqueued object."""
    value = ((body.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_QUEUE)
    return str(value) if value else None


def hold_for_queue(body: Body, spec: JobSpec) -> Body:
    """The held object of a queued job: the queue in dispatch's annotations, none of Kueue's labels."""
    if spec.queue is None:
        return body
    meta = body.setdefault("metadata", {})
    annotations = meta.setdefault("annotations", {})
    annotations[ANNOTATION_QUEUE] = spec.queue
    if spec.workload_priority_class is not None:
        annotations[ANNOTATION_PRIORITY_CLASS] = spec.workload_priority_class
    labels = meta.get("labels") or {}
    if KUEUE_LABEL_QUEUE in labels or KUEUE_LABEL_PRIORITY_CLASS in labels:
        raise ValueError("a held object must not carry Kueue's labels: Kueue would start it")
    return body


KUEUE_RUNTIME_PATCH_MANAGER: Final = "kueue.x-k8s.io/manager"
"""The ``spec.runtimePatches`` entry Kueue writes its node selectors and tolerations into on
admission, for the kinds whose controller starts an object only with it (``"kueue runtime patch not
found"``): :attr:`Kind.kueue_runtime_patch`."""


def whole_for_release(kind: Kind) -> bool:
    """A queued object of this kind is released from a fresh read of the whole object (not the
    kit's projection): its release may write its whole ``runtimePatches`` list."""
    return kind.kueue_runtime_patch


def runtime_patches(kind: Kind, body: Mapping[str, Any]) -> list[Any] | None:
    """The object's ``runtimePatches`` with Kueue's entry added, for a kind that needs it
    (:attr:`Kind.kueue_runtime_patch`) and an object that has none; None otherwise. Kueue's mutating
    webhook appends that entry at creation; where the webhook does not run, the release adds it
    (the list is keyed by manager, so it is never added twice, and it may change while the object
    is suspended). ``body`` must be whole: a merge patch replaces the list."""
    if not whole_for_release(kind):
        return None
    patches = list((body.get("spec") or {}).get("runtimePatches") or ())
    if any(isinstance(p, Mapping) and p.get("manager") == KUEUE_RUNTIME_PATCH_MANAGER for p in patches):
        return None
    entry = {"manager": KUEUE_RUNTIME_PATCH_MANAGER, "trainingRuntimeSpec": {"template": {"spec": {}}}}
    return [*patches, entry]


def release_patch(body: Mapping[str, Any], released_at: str, kind: Kind | None = None) -> Body | None:
    """The one merge patch that hands a queued object to Kueue (its labels, ``dispatch.dev/released``;
    ``suspend`` stays true: Kueue unsuspends it on admission); None for an unqueued object. Kueue's
    label may be added while the object is suspended (jobframework validation.go,
    validateUpdateForQueueName), and so may the priority class. It also carries Kueue's runtime
    patch entry where the kind needs it and it is missing (:func:`runtime_patches`)."""
    queue = queue_of(body)
    if queue is None:
        return None
    meta = body.get("metadata") or {}
    labels = {KUEUE_LABEL_QUEUE: queue}
    priority = (meta.get("annotations") or {}).get(ANNOTATION_PRIORITY_CLASS)
    if priority:
        labels[KUEUE_LABEL_PRIORITY_CLASS] = str(priority)
    patch: Body = {
        "metadata": {
            "resourceVersion": meta.get("resourceVersion"),
            "labels": labels,
            "annotations": {ANNOTATION_RELEASED: released_at},
        }
    }
    patches = runtime_patches(kind, body) if kind is not None else None
    if patches is not None:
        patch["spec"] = {"runtimePatches": patches}
    return patch


def stop_patch(body: Mapping[str, Any]) -> Body:
    """What a stop adds for a queued object: Kueue's queue label removed (so Kueue lets go of it:
    allowed in the same patch that suspends it); nothing for an unqueued object."""
    labels = (body.get("metadata") or {}).get("labels") or {}
    if queue_of(body) is None and KUEUE_LABEL_QUEUE not in labels:
        return {}
    return {"metadata": {"labels": {KUEUE_LABEL_QUEUE: None}}}


# ---- the verdict --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueuedVerdict:
    """What Kueue's side says of a released queued object, for :func:`dispatch._workload.classify`."""

    phase: Phase
    cause: Cause | None = None
    cancelled: bool = False
    waiting: str = ""
    """Why it waits in Kueue's queue (:attr:`ObjectView.waiting`): queued by dispatch's own
    release, so not held outside dispatch, and no Warning."""
    stop: bool = False
    """Kueue has ended this object for dispatch's purposes: dispatch stops it for good."""
    recheck_at: float | None = None


def _unschedulable(pods: Iterable[Mapping[str, Any]]) -> str | None:
    for pod in pods:
        status = pod.get("status") or {}
        if status.get("phase") != "Pending":
            continue
        for c in status.get("conditions") or ():
            if (
                c.get("type") == "PodScheduled"
                and c.get("status") == "False"
                and c.get("reason") == "Unschedulable"
            ):
                return detail(f"pod {(pod.get('metadata') or {}).get('name', '?')}", c.get("message"))
    return None


def eviction_verdict(workload: WorkloadView, pods: Sequence[Mapping[str, Any]]) -> QueuedVerdict | None:
    """The end of an object whose Workload Kueue evicted (now, or before a re-admission: the eviction
    counts), or deactivated; None while it was never evicted."""
    evicted = workload.true(COND_EVICTED)
    reason = evicted.reason if evicted is not None else ""
    message = evicted.message if evicted is not None else ""
    if not workload.active and not reason:
        reason, message = EVICTED_BY_DEACTIVATION, "spec.active is false"
    if not reason:
        counted = [(r, u) for r, u, n in workload.evictions if n > 0]
        if not counted:
            return None
        reason, underlying = counted[0]
        message = f"evicted before (status.schedulingStats.evictions: {reason} {underlying})".strip()
    where = f"Workload {workload.name}"
    if reason == EVICTED_BY_DEACTIVATION:
        cause = Cause(kind=CauseKind.NONE, detail=detail(f"deactivated in Kueue ({where})", message))
        return QueuedVerdict(Phase.ENDED, cause, cancelled=True, stop=True)
    if reason == EVICTED_BY_PREEMPTION:
        preempted = workload.true(COND_PREEMPTED)
        how = preempted.reason if preempted is not None else ""
        text = detail(f"preempted by Kueue ({where})", how, preempted.message if preempted else message)
        return QueuedVerdict(Phase.ENDED, Cause(kind=CauseKind.PREEMPTED, detail=text), stop=True)
    if reason == EVICTED_BY_PODS_READY_TIMEOUT:
        unschedulable = _unschedulable(pods)
        if unschedulable is not None:
            text = detail(f"Kueue's PodsReady timeout ({where}), a pod unschedulable", unschedulable)
            return QueuedVerdict(Phase.ENDED, Cause(kind=CauseKind.NO_CAPACITY, detail=text), stop=True)
        text = detail(f"Kueue's PodsReady timeout ({where}): its pods did not start", message)
        return QueuedVerdict(Phase.ENDED, Cause(kind=CauseKind.LAUNCH_FAILED, detail=text), stop=True)
    if reason == EVICTED_BY_NODE_FAILURES:
        text = detail(f"evicted by Kueue for node failures ({where})", message)
        return QueuedVerdict(Phase.ENDED, Cause(kind=CauseKind.NODE_LOST, detail=text), stop=True)
    # ClusterQueueStopped, LocalQueueStopped, AdmissionCheck...: handed back to the queue by Kueue.
    text = detail(f"evicted by Kueue ({where})", reason, message)
    return QueuedVerdict(Phase.ENDED, Cause(kind=CauseKind.REQUEUED, detail=text), stop=True)


def queued_verdict(
    kind: Kind,
    body: Mapping[str, Any],
    pods: Sequence[Mapping[str, Any]],
    workload: WorkloadView | None,
    *,
    now: float,
    no_capacity_after: int,
) -> QueuedVerdict | None:
    """Kueue's word on a released queued object, or None where the kit's own reading applies
    (an unqueued or unreleased object, or one Kueue admitted and runs)."""
    queue = queue_of(body)
    annotations = (body.get("metadata") or {}).get("annotations") or {}
    if queue is None or not annotations.get(ANNOTATION_RELEASED):
        return None
    if workload is not None:
        ended = eviction_verdict(workload, pods)
        if ended is not None:
            return ended
        if workload.true(COND_FINISHED) is not None:
            return None  # the object's own status says how it finished
    if not kind.suspended(dict(body)):
        return None  # admitted and started by Kueue: running, or ending, as the kit reads it
    if workload is not None and workload.true(COND_ADMITTED) is not None:
        return QueuedVerdict(Phase.QUEUED, waiting=f"admitted by Kueue in queue {queue}; starting")
    pending = workload.condition(COND_QUOTA_RESERVED) if workload is not None else None
    why = pending.message if pending is not None and pending.message else "no Workload yet"
    since = parse_time(annotations.get(ANNOTATION_RELEASED)) or now
    deadline = since + no_capacity_after
    if now >= deadline:
        text = detail(f"not admitted by Kueue in queue {queue} for more than {no_capacity_after}s", why)
        return QueuedVerdict(Phase.ENDED, Cause(kind=CauseKind.NO_CAPACITY, detail=text), stop=True)
    waiting = f"waiting for Kueue admission in queue {queue}: {why}"
    return QueuedVerdict(Phase.QUEUED, waiting=waiting[:_MAX_DETAIL], recheck_at=deadline)


# ---- the shared watch ---------------------------------------------------------------------------------


async def served(api: Client) -> bool:
    """Whether the API server serves Kueue's Workloads (v1beta2): checked once, at open."""
    try:
        found = await request(api, "GET", f"/apis/{KUEUE_GROUP}/{KUEUE_VERSION}")
    except KubeError as error:
        if error.status in (404, 503):
            return False
        raise
    return any(r.get("name") == WORKLOADS.plural for r in found.get("resources") or ())


async def workloads_for(
    kind: Kind, api: Client, namespaces: tuple[str, ...] | None, *, wanted: bool | None, log: logging.Logger
) -> Workloads | None:
    """The shared watch of Kueue's Workloads for a kit backend of ``kind``, when Kueue can queue
    that kind and the API server serves them; None otherwise (``wanted``: False never looks,
    True makes unserved Workloads an error)."""
    info = _registry.get(kind.name)
    if wanted is False or info is None:
        return None
    if not info.capabilities.queues:
        return None
    try:
        found = await served(api)
    except KubeError as error:
        raise explain(error, "look for Kueue's Workloads (kueue.x-k8s.io/v1beta2)") from None
    if not found:
        if wanted:
            raise BackendError("Kueue's Workloads (workloads.kueue.x-k8s.io/v1beta2) are not served")
        log.info("Kueue is not installed: jobs with spec.queue are refused")
        return None
    return Workloads.shared(api, namespaces)


OnOwner = Callable[[str], None]
"""Called with the object id (``namespace/name``) of the owner of a Workload that changed."""


class Workloads:
    """One list+watch of Workloads (per namespace scope), shared by the kit backends of one API
    client: each backend subscribes with its kind and is told which of its objects' Workload changed."""

    _shared: ClassVar[dict[tuple[int, tuple[str, ...] | None], Workloads]] = {}

    def __init__(self, api: Client, namespaces: tuple[str, ...] | None) -> None:
        self.api = api
        self.namespaces = namespaces
        self.by_owner: dict[str, WorkloadView] = {}
        self._subscribers: dict[str, list[OnOwner]] = {}
        self.informers = [
            Informer(
                api,
                WORKLOADS.path(ns),
                label_selector="",
                on_change=self._changed,
                project=project_workload,
                what=f"workloads{f' in {ns}' if ns else ''}",
            )
            for ns in (namespaces or (None,))
        ]
        self._tasks: list[asyncio.Task[None]] = []
        self._users = 0

    @classmethod
    def shared(cls, api: Client, namespaces: tuple[str, ...] | None) -> Workloads:
        key = (id(api), namespaces)
        found = cls._shared.get(key)
        if found is None or found.api is not api:
            found = cls._shared[key] = Workloads(api, namespaces)
        return found

    def subscribe(self, owner_kind: str, on_owner: OnOwner) -> Callable[[], Awaitable[None]]:
        self._subscribers.setdefault(owner_kind, []).append(on_owner)
        self._users += 1
        if not self._tasks:
            loop = asyncio.get_running_loop()
            self._tasks = [loop.create_task(i.run(), name=f"dispatch-kueue-{i.what}") for i in self.informers]

        async def unsubscribe() -> None:
            with contextlib.suppress(ValueError):
                self._subscribers.get(owner_kind, []).remove(on_owner)
            self._users -= 1
            if self._users <= 0:
                await self.aclose()

        return unsubscribe

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        self._shared.pop((id(self.api), self.namespaces), None)

    def of(self, body: Mapping[str, Any]) -> WorkloadView | None:
        uid = (body.get("metadata") or {}).get("uid")
        return self.by_owner.get(str(uid)) if uid else None

    def _changed(self, old: Body | None, new: Body | None) -> None:
        view = workload_view(new if new is not None else old or {})
        if view is None:
            return
        if new is None:
            if self.by_owner.get(view.owner_uid, view).name == view.name:
                self.by_owner.pop(view.owner_uid, None)
        else:
            self.by_owner[view.owner_uid] = view
        for on_owner in list(self._subscribers.get(view.owner_kind, ())):
            on_owner(f"{view.namespace}/{view.owner_name}")

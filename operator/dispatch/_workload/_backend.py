"""The workload kit's backend: each submission of a job is one object of a :class:`Kind`.

Object ids are ``"<namespace>/<object name>"``; job ids are ``"<namespace>/<name>"``.

One list+watch per resource (the kind's objects and the pods labelled
``app.kubernetes.io/managed-by=dispatch``, and the disruption Events by field selector, kept as a slim
index per object) feeds an in-memory cache shared by every job: one
:class:`_Tracked` per object, holding everything known about it (its body from the watch, our own
last write, its pods, what they said before they went, its stop). Each event wakes the subscribers
of the job it belongs to, so the path from a pod or object change to the supervisor's next decision
never polls. :meth:`WorkloadBackend.list` answers from that cache once it has synced, completed by
what this process wrote itself (an object it created is shown even before the watch brings it back).

Stopping an object whose pods say it has ended (the suspend patch with ``dispatch.dev/ended``) is off
the reaction path: the object is reported ended as soon as the evidence is seen, the stop runs in a
background task per object, and :meth:`WorkloadBackend.release` first makes sure that every older
object of the same job is stopped on the API server (the *fence*), so "at most one released object
per job" holds without the supervisor waiting for the stop before it authorizes and creates the next
submission. See docs/kubeflow.md, "Stopping what the scheduler would carry on".

Issue 13 (one shared watch per kind for several backends, slim projections): the cache is fed only
through :meth:`WorkloadBackend._object_changed` / :meth:`WorkloadBackend._pod_changed`, so a shared
informer can call them instead of this backend's own; they take projections (``_project`` and
``_project_pod``), never whole bodies.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from .. import _registry
from .._constants import (
    ANNOTATION_ENDED,
    ANNOTATION_RELEASED,
    API_VERSION,
    GROUP,
    KIND,
    LABEL_JOB,
    LABEL_MANAGED_BY,
    LABEL_SUBMISSION,
    MANAGED_BY,
    OBJECT_FINALIZER,
    PLURAL,
    VERSION,
)
from .._errors import BackendError, ObjectExists, TransientBackendError
from .._kubeclient import (
    JSON_PATCH,
    MERGE_PATCH,
    Client,
    Informer,
    KubeError,
    Packed,
    Packer,
    key_of,
    request,
    resource_version,
    urgent,
)
from .._model import Capabilities, Cause, CauseKind, JobSpec, ObjectView, Phase, Plan
from .._protocols import Others, Unsubscribe, Wake
from ._classify import Verdict, classify, vanished
from ._evidence import (
    Evidence,
    best,
    event_about,
    event_evidence,
    event_objects,
    evidence_events,
    kind_evidence,
    needs_node,
    node_ready,
)
from ._fields import ended_annotation, owner_of, parse_time, restart_budget
from ._kept import POD, object_shape, project_event, project_object, project_pod
from ._kind import Kind, Refused, Target, object_name
from ._kueue import (
    Workloads,
    WorkloadView,
    hold_for_queue,
    queue_of,
    release_patch,
    served,
    stop_patch,
    whole_for_release,
)
from ._mask import Body, reader
from ._release import release_ops

SELECTOR: Final = f"{LABEL_MANAGED_BY}={MANAGED_BY}"
MAX_TOMBSTONES: Final = 10_000
MAX_EARLY_EVENTS: Final = 2_000
"""Object names under which disruption Events about objects not (yet) tracked are kept."""
NODE_CACHE_SECONDS: Final = 10.0
EVENTS_CACHE_SECONDS: Final = 2.0
LOOK_AGAIN_SECONDS: Final = 3.0
EARLY_EVENT_CAUSES: Final = frozenset({CauseKind.PREEMPTED})
"""What an Event may say of a watched object that runs before its pods say it: a disruption that
only ever hits a live pod (the scheduler's Preempted, the kubelet's Evicted). Not the taint
manager's eviction: it deletes a node's terminated pods too, so its Event can follow an
out-of-memory or an exit the pod watch has not delivered yet (the pods' word comes first then). A
controller's Event that it cannot create pods ends only an object with no pod at all
(``PODLESS_AFTER_SECONDS``)."""
PODLESS_AFTER_SECONDS: Final = 2.0
STOP_RETRY: Final = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)

OwnerLookup = Callable[[Client, str, str], Awaitable[Mapping[str, Any] | None]]
"""``(api, namespace, job name) -> ownerReference`` for the objects of that job, or None for none."""


async def dispatchjob_owner(api: Client, namespace: str, name: str) -> Mapping[str, Any]:
    """The DispatchJob as the controlling owner: deleting it deletes its objects (the operator's
    default; a library user without the CRD passes ``owner=None``)."""
    path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}"
    try:
        found = await request(api, "GET", path)
    except KubeError as error:
        raise explain(error, f"GET DispatchJob {namespace}/{name}") from None
    uid = found.get("metadata", {}).get("uid")
    if not uid:
        raise BackendError(f"DispatchJob {namespace}/{name} has no uid")
    return {"apiVersion": API_VERSION, "kind": KIND, "name": name, "uid": uid, "controller": True}


@dataclass(eq=False)
class _Stop:
    """A stop this process has decided on: the object is reported ended with ``cause`` from then on."""

    oid: str
    job: str
    submission: int
    cause: Cause
    deferrable: bool
    """The controller finishes the object itself (a failed pod it does not restart): the patch
    waits up to ``stop_grace`` for that, unless a release needs the object stopped now."""
    settle_waits: bool = False
    """Deferred, yet settling waits for it: the controller normally finishes the object itself but
    may not (restarts past the rule's budget: see ``Verdict.stop_after_grace``)."""
    now: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    landed: bool = False
    """The object is stopped on the API server (by us or its controller) or gone."""
    error: Exception | None = None


@dataclass(eq=False)
class _Tracked:
    """Everything this process knows about one object (by id), in one place."""

    job: str | None = None
    """The job it belongs to, from its labels (or the create that made it)."""
    body: Packed | None = None
    """Its projection as the watch last showed it (packed: :meth:`Packed.body` decodes it)."""
    overlay: Packed | None = None
    """The projection of our own last write, until the watch shows it (or something newer)."""
    pods: dict[str, Packed] = field(default_factory=dict)
    """Its pods' projections by key, from the pod watch (kept after the object goes, while they
    still run)."""
    ended_by_us: bool = False
    retained: Evidence | None = None
    """What a pod said about the end of the object, kept for when the pod is gone."""
    last_restart: Cause | None = None
    incarnations: dict[str, int] = field(default_factory=dict)
    """Pod uid -> most in-place restarts seen (a recreated pod starts again from 0)."""
    restarts: int = 0
    last_view: ObjectView | None = None
    verdict: tuple[tuple[object, ...], Verdict] | None = None
    released_at: float | None = None
    looked: float = 0.0
    """When (monotonic) its evidence may be looked for on the API server again."""
    stop: _Stop | None = None
    sweeping: bool = False

    def current(self) -> Packed | None:
        mine, cached = self.overlay, self.body
        if mine is None:
            return cached
        if cached is None or (mine.version or 0) > (cached.version or 0):
            return mine
        return cached

    def pod_bodies(self) -> builtins.list[Body]:
        return [pod.body() for pod in self.pods.values()]

    def forgotten(self) -> _Tracked:
        """What is left once the object is gone from the API server: its pods still running."""
        return _Tracked(job=self.job, pods=self.pods)


_fields_sets: dict[frozenset[str], set[str]] = {}


def kept_view(view: ObjectView) -> ObjectView:
    """``view`` as the cache keeps it (each object's verdict and last view): its
    ``model_fields_set`` one shared set per combination of fields, where pydantic gives every
    instance its own (a set of five names is 728 bytes, more than the rest of the view together).
    The models are frozen, so nothing adds to the set in place; ``model_copy`` copies it first."""
    fields = view.__pydantic_fields_set__
    shared = _fields_sets.setdefault(frozenset(fields), fields)
    if shared is not fields:
        object.__setattr__(view, "__pydantic_fields_set__", shared)
    return view


def refused_for_good(error: KubeError) -> bool:
    """The API server (or an admission webhook, such as a controller's validator) refused the object
    itself: sending it again can only be refused again."""
    if error.status in (400, 413, 422):
        return True
    return error.status == 403 and "denied the request" in error.message


def split_id(value: str, what: str = "job") -> tuple[str, str]:
    namespace, sep, name = value.partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise BackendError(f"a Kubernetes {what} id is '<namespace>/<name>', not {value!r}")
    return namespace, name


def explain(error: KubeError, doing: str) -> BackendError:
    if error.status == 404:
        return BackendError(f"{doing}: not found ({error.message})")
    if error.status in (401, 403):
        return BackendError(f"{doing}: not allowed ({error.status} {error.reason}): {error.message}")
    if error.status == 422:
        return BackendError(f"{doing}: rejected as invalid: {error.message}")
    return BackendError(f"{doing}: {error.status} {error.reason}: {error.message}")


_DEFAULT_OWNER: Final[OwnerLookup] = dispatchjob_owner


class WorkloadBackend:
    """A :class:`~dispatch.Backend` running each submission as one object of ``kind``."""

    def __init__(
        self,
        kind: Kind,
        api: Client,
        *,
        namespaces: Sequence[str] | None = None,
        stop_ended: bool = True,
        sync_timeout: float = 30.0,
        stop_grace: float = 2.0,
        pod_cleanup_after: float = 30.0,
        owns_api: bool = False,
        owner: OwnerLookup | None = _DEFAULT_OWNER,
        clock: Callable[[], float] = time.time,
        kueue: bool | None = None,
    ) -> None:
        """``namespaces`` limits the watches (default: all namespaces). ``stop_ended=False`` makes a
        read-only observer: it never stops an object whose pods say it has ended. ``stop_grace``: how
        long a stop the controller will make itself (a failed pod it does not restart) waits for it
        before dispatch writes it. ``pod_cleanup_after``: how long after a stop the pods the
        controller should have deleted may still run before dispatch deletes them itself.
        ``owner``: the ownerReference of a job's objects (default: its DispatchJob; None: none).
        ``kueue``: watch Kueue's Workloads so that jobs with ``spec.queue`` can run (None: where the
        API server serves them, found by :meth:`prepare`; False: never, and such jobs are refused)."""
        self.kind = kind
        self.api = api
        self.namespaces = tuple(namespaces) if namespaces else None
        self.stop_ended = stop_ended
        self.sync_timeout = sync_timeout
        self.stop_grace = stop_grace
        self.pod_cleanup_after = pod_cleanup_after
        self._owner = owner
        self._owns_api = owns_api
        self._clock = clock
        self._born = clock()
        self._noun = kind.resource.kind
        self._shape = object_shape(kind)
        self._log = logging.getLogger(f"dispatch.{kind.name}")
        self._subscribers: dict[str, list[Wake]] = {}
        self._others = Others()  # subscribe_others: the jobs without a subscriber
        self._informers: list[Informer[Packed]] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._tracked: dict[str, _Tracked] = {}
        self._pack_object = Packer()  # what the cache keeps of each object (and pod): Packed
        self._pack_pod = Packer()
        # job id -> ids of its tracked objects (a tuple: a job has a few, and a set of one is 216 bytes)
        self._by_job: dict[str, tuple[str, ...]] = {}
        self._tombstones: OrderedDict[str, ObjectView] = OrderedDict()
        self._refused: dict[str, ObjectView] = {}  # object id -> a create refused for good (never existed)
        self._early: OrderedDict[str, list[Body]] = OrderedDict()  # pods seen before their object
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._nodes: dict[str, tuple[bool, float]] = {}
        self._background: set[asyncio.Task[None]] = set()
        self._events: dict[str, tuple[float, list[Body]]] = {}  # namespace -> (until, disruption events)
        # scope -> its disruption Events watches
        self._event_informers: dict[str | None, list[Informer[Body]]] = {}
        self._evidence: dict[str, dict[str, Body]] = {}  # object id -> {event key: slim Event about it}
        self._early_events: OrderedDict[str, dict[str, Body]] = OrderedDict()  # the same, object not seen yet
        self._events_reading: dict[str, asyncio.Future[list[Body]]] = {}  # namespace -> the read in flight
        self._kueue_wanted = kueue
        self._workloads: Workloads | None = None
        self._unwatch_kueue: Callable[[], Awaitable[None]] | None = None

    # ---- Backend protocol ------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.kind.name

    @property
    def capabilities(self) -> Capabilities:
        # Kueue can queue this backend's objects only once its Workloads are watched (prepare()).
        caps = self.kind.capabilities
        queues = self._workloads is not None
        return caps if caps.queues is queues else caps.model_copy(update={"queues": queues})

    @property
    def wakes_itself(self) -> bool:
        """Every change its watches see wakes the job, and so do its own timers at the moments no
        event announces (:meth:`_wake_at`: a verdict's due time, a podless object's next look, a node
        to look up again): the operator's loop need not look at its jobs periodically
        (:class:`~dispatch._protocols.SelfWaking`)."""
        return True

    async def prepare(self) -> None:
        """Once, at open: watch Kueue's Workloads (shared by the kit backends of this API client)
        when Kueue can queue this kind and the API server serves them."""
        info = _registry.get(self.kind.name)
        if self._kueue_wanted is False or self._workloads is not None or info is None:
            return
        if not info.capabilities.queues:
            return
        try:
            found = await served(self.api)
        except KubeError as error:
            raise explain(error, "look for Kueue's Workloads (kueue.x-k8s.io/v1beta2)") from None
        if not found:
            if self._kueue_wanted:
                raise BackendError("Kueue's Workloads (workloads.kueue.x-k8s.io/v1beta2) are not served")
            self._log.info("Kueue is not installed: jobs with spec.queue are refused")
            return
        self._workloads = Workloads.shared(self.api, self.namespaces)
        self._unwatch_kueue = self._workloads.subscribe(self.kind.resource.kind, self._workload_changed)

    def _workload_changed(self, oid: str) -> None:
        """A Workload of one of our objects changed: its verdict may have (admitted, evicted)."""
        state = self._tracked.get(oid)
        if state is None:
            return
        state.verdict = None
        self._check_stop(oid)
        self._wake(state.job)

    def _workload_of(self, body: Body) -> WorkloadView | None:
        return self._workloads.of(body) if self._workloads is not None else None

    async def create(self, job: str, submission: int, spec: JobSpec, plan: Plan) -> str:
        namespace, job_name = split_id(job)
        self._start()
        owner = await self._owner(self.api, namespace, job_name) if self._owner is not None else None
        target = Target(namespace, job_name, submission, owner)
        oid = target.id
        try:
            body = hold_for_queue(self.kind.build(target, spec, plan), spec)
        except Refused as refused:
            return self._refuse(oid, job, submission, f"not created: {refused}")
        try:
            created = await request(self.api, "POST", self._path(namespace), body=body)
        except KubeError as error:
            if error.status == 409:
                raise ObjectExists(oid) from None
            if refused_for_good(error):
                return self._refuse(oid, job, submission, f"the API server refused it: {error.message}")
            raise explain(error, f"create {self._noun} {oid}") from None
        self._remember(oid, job, created)
        return oid

    def _refuse(self, oid: str, job: str, submission: int, detail: str) -> str:
        """A submission that can never run: reported ended ``launch-failed`` under the name it would
        have had, so the job says why within the same reaction instead of retrying a create that will
        be refused again. In memory only: after a restart the canonical is missing, which the
        supervisor's decision treats as ended as well."""
        cause = Cause(kind=CauseKind.LAUNCH_FAILED, detail=detail[:1024])
        self._log.warning("%s %s %s", self._noun, oid, detail)
        self._refused[oid] = ObjectView(
            id=oid, job=job, submission=submission, phase=Phase.ENDED, cause=cause
        )
        self._wake(job)
        return oid

    async def release(self, object_id: str) -> None:
        namespace, name = split_id(object_id, "object")
        body = self._current(object_id)
        if body is None:
            body = await self._get(namespace, name)
            if body is None:
                self._log.info("release %s: it no longer exists", object_id)
                return
            self._remember(object_id, None, body)
        owner = owner_of(body)
        if owner is not None:
            # Invariant 1 without waiting on the hot path: the older objects of the job are stopped
            # on the API server before this one may start (usually the stop landed long ago).
            await self._fence(owner[0], owner[1], object_id)
            body = self._current(object_id)
        refused = False
        for _ in range(5):
            if body is None or (queue_of(body) is not None and whole_for_release(self.kind)):
                body = await self._get(namespace, name)  # whole: the cache keeps a projection
                if body is None:
                    self._log.info("release %s: it no longer exists", object_id)
                    return
            annotations = body.get("metadata", {}).get("annotations") or {}
            now = datetime.fromtimestamp(self._clock(), UTC).isoformat()
            # A queued object is released into Kueue's queue and stays suspended: Kueue starts it.
            patch = release_patch(body, now, self.kind)
            if (
                annotations.get(ANNOTATION_ENDED)
                or not self.kind.suspended(body)
                or body["metadata"].get("deletionTimestamp")
                or (patch is not None and annotations.get(ANNOTATION_RELEASED))
            ):
                return  # already released, or ended: never unsuspend what dispatch has stopped
            # Unqueued: a JSON patch whose tests are the preconditions (_release.py), so the
            # controller's status update after the create does not make it fail; queued: a merge
            # patch conditional on the resourceVersion (Kueue's labels, a TrainJob's whole list).
            ops = release_ops(self.kind, body, now) if patch is None else None
            try:
                patched = await request(
                    self.api,
                    "PATCH",
                    self._path(namespace, name),
                    body=ops if ops is not None else patch,
                    content_type=JSON_PATCH if ops is not None else MERGE_PATCH,
                )
            except KubeError as error:
                if error.status == 404:
                    return
                if error.status == 409 or (error.status == 422 and ops is not None and not refused):
                    # Changed since read (409), or a test failed (422): read again and decide again
                    # (a second 422 with every precondition holding is not a test: it is raised).
                    refused = refused or error.status == 422
                    body = None
                    continue
                raise explain(error, f"release {self._noun} {object_id}") from None
            self._remember(object_id, None, patched)
            self._state(object_id).released_at = self._clock()
            return
        raise TransientBackendError(f"release {object_id}: it kept changing under us")

    async def end(self, object_id: str) -> None:
        namespace, name = split_id(object_id, "object")
        tracked = self._tracked.get(object_id)
        stop = tracked.stop if tracked is not None else None
        if stop is not None and stop.task is not None and not stop.task.done():
            # Deleting supersedes a stop in flight (or waiting for the controller).
            stop.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await stop.task
        body = self._current(object_id)
        owner = owner_of(body) if body is not None else None
        # Ours to let go of first: once deleted, this process no longer lists it as held by it.
        await self._let_go(namespace, name, body)
        await self._delete(namespace, name)
        if owner is not None:
            state = self._state(object_id)
            state.ended_by_us = True
            self._index(object_id, owner[0])
        if stop is not None:
            stop.landed = True  # deleted: nothing of it can run any more
        await self._delete_pods(namespace, name, body)
        self._wake(owner[0] if owner is not None else None)

    async def confirm(self, job: str, object_id: str) -> Sequence[ObjectView]:
        """The watch cache lags writes made by another process (a second supervisor, the one before a
        restart): a canonical it does not show is looked up on the API server before it counts as
        gone, and kept as our own write until the watch brings it."""
        split_id(job)
        await self._synced()
        if self._current(object_id) is None and object_id not in self._tombstones:
            namespace, name = split_id(object_id, "object")
            body = await self._get(namespace, name)
            owner = owner_of(body) if body is not None else None
            if body is not None and owner is not None and owner[0] == job:
                self._log.info(
                    "job %s: canonical %s found on the API server before the watch showed it", job, object_id
                )
                self._remember(object_id, job, body)
        return await self.list(job)

    async def list(self, job: str) -> Sequence[ObjectView]:
        split_id(job)
        await self._synced()
        # A stop in flight is not waited for here: the object is shown ended at once, so that the
        # next submission is authorized and created while the stop lands; the release's fence and
        # quiesce() (before the job is recorded settled) are where it must have landed.
        views: list[ObjectView] = []
        for oid in sorted(self._ids_of(job)):
            if oid in self._tombstones:
                continue
            body = self._current(oid)
            if body is None:
                continue
            state = self._state(oid)
            verdict = await self._classify(oid, body)
            view = verdict.view
            seen = state.restarts
            counted = sum(state.incarnations.values())
            if counted:
                budget = restart_budget(body)
                seen = max(seen, min(counted, budget) if budget is not None else counted)
            if view.restarts < seen:
                view = view.model_copy(update={"restarts": seen})
            else:
                state.restarts = view.restarts
            view = vanished(view) if state.ended_by_us else self._stop_view(oid, body, verdict, view)
            state.last_view = kept_view(view)
            if verdict.recheck_at is not None:
                self._wake_at(f"recheck:{oid}", job, verdict.recheck_at)
            views.append(view)
        views.extend(v for v in self._tombstones.values() if v.job == job)
        views.extend(v for v in self._refused.values() if v.job == job)
        views = [self._terminating(v) for v in views]
        views.sort(key=lambda v: (v.submission, v.id))
        return views

    def _terminating(self, view: ObjectView) -> ObjectView:
        """Ended, but a pod of it still runs (a deletion's grace period, a stop the controller has not
        carried out yet): the job must not settle yet. A pod being deleted on a lost node is not
        waited for: no kubelet will ever confirm it."""
        if view.phase is not Phase.ENDED:
            return view
        tracked = self._tracked.get(view.id)
        if tracked is None:
            return view
        now = time.monotonic()
        lost = {node for node, (is_lost, until) in self._nodes.items() if is_lost and until > now}
        for pod in tracked.pod_bodies():
            if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                continue
            deleting = pod.get("metadata", {}).get("deletionTimestamp")
            if deleting and pod.get("spec", {}).get("nodeName") in lost:
                continue
            return view.model_copy(update={"terminating": True})
        return view

    def subscribe(self, job: str, wake: Wake) -> Unsubscribe:
        self._subscribers.setdefault(job, []).append(wake)
        with contextlib.suppress(RuntimeError):  # no running loop: started by the first call
            self._start()

        def unsubscribe() -> None:
            wakes = self._subscribers.get(job)
            if wakes is not None:
                with contextlib.suppress(ValueError):
                    wakes.remove(wake)
                if not wakes:
                    del self._subscribers[job]

        return unsubscribe

    def subscribe_others(self, wake: Callable[[str], None]) -> Unsubscribe:
        """Call ``wake(job)`` on a change of a job nobody subscribed to
        (:class:`~dispatch._protocols.Overseeing`)."""
        return self._others.subscribe(wake)

    def use_owner(self, owner: OwnerLookup | None) -> None:
        """Where the ownerReference of a job's objects comes from from now on (the operator's record
        store knows each DispatchJob's uid: no GET of the DispatchJob per create)."""
        self._owner = owner

    async def aclose(self) -> None:
        tasks = [*self._tasks, *self._background]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        self._background.clear()
        await asyncio.sleep(0)  # let the aborted watch connections finish closing
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        self._subscribers.clear()
        self._others.clear()
        if self._unwatch_kueue is not None:
            await self._unwatch_kueue()
            self._unwatch_kueue = self._workloads = None
        if self._owns_api:
            await self.api.close()

    # ---- the cache ---------------------------------------------------------------------------

    def _start(self) -> None:
        if self._tasks:
            return
        loop = asyncio.get_running_loop()
        scopes: Sequence[str | None] = self.namespaces or (None,)
        objects: list[Informer[Packed]] = []
        pods: list[Informer[Packed]] = []
        for ns in scopes:
            where = f" in {ns}" if ns else ""
            objects.append(
                Informer(
                    self.api,
                    self._path(ns),
                    label_selector=SELECTOR,
                    on_change=self._object_changed,
                    on_relist=self._relisted,
                    project=self._project,
                    pack=self._pack_object,
                    read=reader(self._shape),
                    what=f"{self.kind.resource.plural}{where}",
                )
            )
            pods.append(
                Informer(
                    self.api,
                    f"/api/v1/namespaces/{ns}/pods" if ns else "/api/v1/pods",
                    label_selector=SELECTOR,
                    on_change=self._pod_changed,
                    project=self._project_pod,
                    pack=self._pack_pod,
                    read=reader(POD),
                    what=f"pods{where}",
                )
            )
        self._informers = [*objects, *pods]
        self._event_informers = {
            ns: [
                Informer(
                    self.api,
                    f"/api/v1/namespaces/{ns}/events" if ns else "/api/v1/events",
                    label_selector="",
                    field_selector=f"involvedObject.kind={kind},reason={reason}",
                    on_change=self._event_changed,
                    project=project_event,
                    store=False,
                    what=f"{kind} {reason} events{f' in {ns}' if ns else ''}",
                )
                for kind, reason in evidence_events(self.kind)
            ]
            for ns in scopes
        }
        name = self.kind.name
        self._tasks = [loop.create_task(i.run(), name=f"dispatch-{name}-{i.what}") for i in self._informers]
        self._tasks += [
            loop.create_task(self._watch_events(i, objects), name=f"dispatch-{name}-{i.what}")
            for informers in self._event_informers.values()
            for i in informers
        ]

    async def _watch_events(self, informer: Informer[Body], objects: Sequence[Informer[Packed]]) -> None:
        """The disruption Events, listed once the objects are: every Event about an object that
        exists then finds it tracked (the others wait in :attr:`_early_events` for their object)."""
        await asyncio.gather(*(i.synced.wait() for i in objects))
        await informer.run()

    async def _synced(self) -> None:
        self._start()
        kueue = self._workloads.informers if self._workloads is not None else []
        every: tuple[Informer[Any], ...] = (*self._informers, *kueue)
        pending = [i for i in every if not i.synced.is_set()]
        if not pending:
            return
        try:
            async with asyncio.timeout(self.sync_timeout):
                await asyncio.gather(*(i.synced.wait() for i in pending))
        except TimeoutError:
            reasons = "; ".join(f"{i.what}: {i.last_error}" for i in pending if i.last_error) or "no answer"
            hint = ""
            if any(isinstance(i.last_error, KubeError) and i.last_error.status == 404 for i in pending):
                hint = f" (is the {self._noun} CRD {self.kind.resource} installed?)"
            raise TransientBackendError(
                f"the {self.kind.name} watches have not synced: {reasons}{hint}"
            ) from None

    def _state(self, oid: str) -> _Tracked:
        state = self._tracked.get(oid)
        if state is None:
            state = self._tracked[oid] = _Tracked()
        return state

    def _index(self, oid: str, job: str | None) -> None:
        if job:
            self._state(oid).job = job
            ids = self._by_job.get(job, ())
            if oid not in ids:
                self._by_job[job] = (*ids, oid)

    def _project(self, body: Body) -> Body:
        """What the cache keeps of an object of this kind (see ``_classify.object_shape``)."""
        return project_object(self._shape, body)

    def _project_pod(self, pod: Body) -> Body:
        """What the cache keeps of a pod (``_classify.POD``)."""
        return project_pod(pod)

    def _packed(self, body: Body) -> Packed:
        """An object as the cache keeps it (its projection, packed), as its watch hands it on."""
        return self._pack_object(self._project(body))

    def _packed_pod(self, pod: Body) -> Packed:
        """A pod as the cache keeps it, as its watch hands it on."""
        return self._pack_pod(self._project_pod(pod))

    def _object_changed(self, old: Packed | None, new: Packed | None) -> None:
        # ``old`` and ``new`` are packed projections already (the informer projects and packs each
        # body as its event or list page arrives, :meth:`_remember` its own writes).
        packed = new if new is not None else old
        if packed is None:
            return
        body = packed.body()
        oid = key_of(body)
        owner = owner_of(body)
        job = owner[0] if owner is not None else None
        if new is None:
            state = self._tracked.get(oid)
            if state is not None:
                state.body = None
            if job is not None:
                ids = self._by_job.get(job)
                if ids is not None and oid in ids:
                    left = tuple(i for i in ids if i != oid)
                    if left:
                        self._by_job[job] = left
                    else:
                        del self._by_job[job]
                last = state.last_view if state is not None else None
                if last is None:
                    last = self._verdict_now(oid, body).view
                self._tombstone(vanished(last))
            self._forget(oid)
        else:
            state = self._state(oid)
            state.body = new
            self._index(oid, job)
            for pod in self._early.pop(oid, ()):
                self._retain(oid, body, pod)
            self._claim_events(oid, body)
            mine = state.overlay
            if mine is not None and (new.version or 0) >= (mine.version or 0):
                state.overlay = None
            self._check_stop(oid)
        self._wake(job)

    def _relisted(self, rv: str) -> None:
        """Our own writes older than a fresh list and missing from it were deleted meanwhile."""
        try:
            listed = int(rv)
        except ValueError:
            return
        for state in builtins.list(self._tracked.values()):
            mine = state.overlay
            if mine is not None and state.body is None and (mine.version or 0) <= listed:
                self._object_changed(mine, None)

    def _pod_changed(self, old: Packed | None, new: Packed | None) -> None:
        # Packed projections, as for :meth:`_object_changed`.
        packed = new if new is not None else old
        if packed is None:
            return
        body = packed.body()
        owner = owner_of(body)
        if owner is None:
            return
        job, n = owner
        namespace, job_name = job.split("/", 1)
        oid = f"{namespace}/{object_name(job_name, n)}"
        pod_key = key_of(body)
        current = self._current(oid)
        if new is None:
            tracked = self._tracked.get(oid)
            if tracked is not None:
                tracked.pods.pop(pod_key, None)
            timer = self._timers.pop(f"pod:{pod_key}", None)
            if timer is not None:
                timer.cancel()
            if current is not None:
                self._retain(oid, current, body)
            else:
                self._keep_early(oid, body)
        else:
            self._state(oid).pods[pod_key] = new
            if current is None:
                self._keep_early(oid, body)
            else:
                self._retain(oid, current, body)
                _, at = kind_evidence(self.kind, current, body, now=self._clock())
                if at is not None:
                    self._wake_at(f"pod:{pod_key}", job, at)
        if current is not None:
            self._check_stop(oid)
        self._wake(job)

    def _keep_early(self, oid: str, pod: Body) -> None:
        """The pod watch is ahead of the object watch: keep every word of the pod until its object
        arrives (a preempted pod is deleted about a second after it says why; the container's
        lastState is replaced once it is terminated)."""
        self._early.setdefault(oid, []).append(pod)
        self._early.move_to_end(oid)
        while len(self._early) > MAX_TOMBSTONES:
            self._early.popitem(last=False)

    def _retain(self, oid: str, body: Body, pod: Body) -> None:
        """Keep what a pod said about the end of its object, for when the pod is gone, and how often
        each incarnation of it was restarted in place (a recreated pod starts again from 0)."""
        state = self._state(oid)
        restarted = False
        if self.kind.in_place(body):
            uid = pod.get("metadata", {}).get("uid") or key_of(pod)
            count = self.kind.restarts(pod)
            if count > state.incarnations.get(uid, 0):
                state.incarnations[uid] = count
                restarted = True
        found, _ = kind_evidence(self.kind, body, pod, now=self._clock())
        if found is None or found.cause.kind is CauseKind.NO_CAPACITY:
            return
        if not found.terminal:
            # The restart that reached the backoff limit is the last one *made*, not the last pod
            # update that still shows an older lastState.
            if restarted or state.last_restart is None:
                state.last_restart = found.cause
        else:
            # Kept at once, not only when the pod is deleted: the pod may change a moment later
            # (a deletion's SIGTERM replaces the container's state) before it goes.
            kept = best(e for e in (state.retained, found) if e is not None)
            if kept is not None:
                state.retained = kept

    def _forget(self, oid: str) -> None:
        self._early.pop(oid, None)
        self._evidence.pop(oid, None)
        self._early_events.pop(oid, None)
        state = self._tracked.pop(oid, None)
        if state is None:
            return
        if state.pods:
            self._tracked[oid] = state.forgotten()
        stop = state.stop
        if stop is not None:
            stop.landed = True  # gone from the API server: nothing of it can run
            stop.now.set()
        for key in (f"recheck:{oid}", f"cleanup:{oid}"):
            timer = self._timers.pop(key, None)
            if timer is not None:
                timer.cancel()

    def _event_changed(self, old: Body | None, new: Body | None) -> None:
        """From the disruption Events watches (which keep nothing themselves): an Event about an
        object this process tracks goes into that object's index and wakes its job, so an Event
        that arrives after the end it explains (the pod watch lagging, or pods gone before this
        process saw them) is read without a poll; one about no object seen yet waits in
        :attr:`_early_events`; one the API server deleted (its TTL, an hour by default) is dropped."""
        event = new if new is not None else old
        if event is None:
            return
        namespace = event.get("metadata", {}).get("namespace", "")
        key = key_of(event)
        oids = [f"{namespace}/{name}" for name in event_objects(self.kind, event)]
        if new is None:
            for oid in oids:
                for kept in (self._evidence, self._early_events):
                    events = kept.get(oid)
                    if events is not None:
                        events.pop(key, None)
                        if not events:
                            del kept[oid]
            return
        placed = False
        for oid in oids:
            body = self._current(oid)
            if body is not None and event_about(self.kind, body, new):
                placed = True
                self._index_event(oid, body, key, new)
        if placed:
            return
        for oid in oids:
            self._early_events.setdefault(oid, {})[key] = new
            self._early_events.move_to_end(oid)
        while len(self._early_events) > MAX_EARLY_EVENTS:
            self._early_events.popitem(last=False)

    def _index_event(self, oid: str, body: Body, key: str, event: Body) -> None:
        if (body.get("metadata", {}).get("annotations") or {}).get(ANNOTATION_ENDED):
            return  # its cause is written on it: never looked for again
        events = self._evidence.setdefault(oid, {})
        if events.get(key) == event:
            return  # listed again
        events[key] = event
        state = self._tracked.get(oid)
        if state is not None:
            self._wake(state.job)

    def _claim_events(self, oid: str, body: Body) -> None:
        """``oid`` is tracked (again): the Events that arrived before it are its own now, and an
        object whose cause is written on it needs none."""
        early = self._early_events.pop(oid, None)
        if (body.get("metadata", {}).get("annotations") or {}).get(ANNOTATION_ENDED):
            self._evidence.pop(oid, None)
            return
        for key, event in (early or {}).items():
            if event_about(self.kind, body, event):
                self._index_event(oid, body, key, event)

    def _indexed_events(self, oid: str) -> builtins.list[Body] | None:
        """The disruption Events about ``oid`` from the watches' index, or None while those watches
        have not listed yet (or do not cover its namespace)."""
        namespace, _ = split_id(oid, "object")
        informers = self._event_informers.get(None if self.namespaces is None else namespace)
        if not informers or not all(i.synced.is_set() for i in informers):
            return None
        return builtins.list(self._evidence.get(oid, {}).values())

    def _tombstone(self, view: ObjectView) -> None:
        self._tombstones[view.id] = view
        self._tombstones.move_to_end(view.id)
        while len(self._tombstones) > MAX_TOMBSTONES:
            self._tombstones.popitem(last=False)

    def _remember(self, oid: str, job: str | None, body: Body) -> None:
        """Our own write: newer than the cache until the watch brings it (or something newer) back."""
        body = self._project(body)
        state = self._state(oid)
        cached = state.body
        if cached is not None and (cached.version or 0) >= (resource_version(body) or 0):
            return  # nothing newer to keep: not packed
        state.overlay = self._pack_object(body)
        owner = owner_of(body)
        self._index(oid, job if job is not None else (owner[0] if owner is not None else None))
        self._tombstones.pop(oid, None)
        self._claim_events(oid, body)

    def _current(self, oid: str) -> Body | None:
        """The object's projection, newest of the watch's and our own last write's (a copy)."""
        state = self._tracked.get(oid)
        packed = state.current() if state is not None else None
        return packed.body() if packed is not None else None

    def _ids_of(self, job: str) -> set[str]:
        return set(self._by_job.get(job, ()))

    def _wake(self, job: str | None) -> None:
        if job is None:
            return
        wakes = self._subscribers.get(job)
        for wake in builtins.list(wakes) if wakes else ():
            wake()
        if not wakes:
            for other in self._others:
                other(job)

    def _wake_at(self, key: str, job: str, at: float) -> None:
        """Wake ``job`` at wall-clock time ``at`` (a threshold no event will announce)."""
        if key in self._timers:
            return
        loop = asyncio.get_running_loop()
        delay = max(at - self._clock(), 0.0) + 0.05

        def fire() -> None:
            self._timers.pop(key, None)
            self._wake(job)

        self._timers[key] = loop.call_later(delay, fire)

    def stopped(self, body: Body) -> bool:
        """The API server says this object can run nothing any more, for good: stopped by dispatch
        (the annotation), finished by its controller (which then runs nothing), or being deleted.
        None of these can be undone by dispatch or the controller."""
        meta = body.get("metadata", {})
        if (meta.get("annotations") or {}).get(ANNOTATION_ENDED) or meta.get("deletionTimestamp"):
            return True
        return self.kind.outcome(body, None) is not None

    # ---- classification ----------------------------------------------------------------------

    def _verdict_now(self, oid: str, body: Body) -> Verdict:
        """Without I/O: nodes are taken as present unless this process already found them gone."""
        now = time.monotonic()
        gone = {node for node, (is_gone, until) in self._nodes.items() if is_gone and until > now}
        state = self._tracked.get(oid) or _Tracked()
        return classify(
            self.kind,
            body,
            state.pod_bodies(),
            now=self._clock(),
            gone_nodes=gone,
            retained=state.retained,
            last_restart=state.last_restart,
            restarts_seen=sum(state.incarnations.values()),
            workload=self._workload_of(body),
        )

    async def _classify(self, oid: str, body: Body) -> Verdict:
        """The verdict on one object; remembered while nothing it was computed from has changed
        (a job's list() classifies every object it ever had, many times per recovery).

        When the cache holds no reason for an object's end (the pods are gone, the pod watch lags
        the object watch, or this process started after the fact), the API server is asked once:
        the pods themselves, then the disruption events Kubernetes recorded on them (see
        :meth:`_look_for_evidence`; the events come from the Events watches' index once they have
        listed, and an Event arriving later wakes the job and is read here without a request). A
        released object restarting pods in place is looked at once per process the same way, since
        its controller may recreate a preempted pod by itself. Any other object released before this
        process watched it is read from the Events index: its controller may replace a deleted pod
        too (the training operator does, policy Never or not, when it did not see the pod fail
        before it was gone), so a preemption while no process watched can leave a running pod and
        only the disruption Event (the Events watches' first list wakes the job)."""
        state = self._state(oid)
        verdict = await self._classify_cached(oid, body)
        view = verdict.view
        unexplained = (
            view.phase is Phase.ENDED
            and view.cause is not None
            and (view.cause.kind is CauseKind.UNKNOWN and not view.cancelled)
        )
        released = view.phase in (Phase.QUEUED, Phase.RUNNING) and not self.kind.suspended(body)
        started = parse_time(body.get("status", {}).get("startTime"))
        # Released before this process watched it: a pod may have been preempted and recreated
        # by the controller meanwhile (its watch saw everything since).
        unwatched = released and (started is None or started < self._born)
        recreating = unwatched and self.kind.in_place(body)
        podless = released and view.phase is Phase.QUEUED and not state.pods
        running_once = released and not self.kind.in_place(body)
        if podless:
            since = (
                started or state.released_at or parse_time(body.get("metadata", {}).get("creationTimestamp"))
            )
            due = (since if since is not None else self._clock()) + PODLESS_AFTER_SECONDS
            if self._clock() < due:
                podless = False  # the controller is still creating its pods
                if view.job:
                    self._wake_at(f"look:{oid}", view.job, due)
        # Objects for which whatever an Event says counts (podless as settled just above):
        any_event = unexplained or podless or unwatched
        annotated = (body.get("metadata", {}).get("annotations") or {}).get(ANNOTATION_ENDED)
        now = time.monotonic()
        if (unexplained or recreating or podless) and not annotated and state.looked <= now:
            # Once per process for an end or an in-place object; every few seconds while a
            # released object has no pod at all (its controller may be failing to create them).
            again = podless and not recreating
            state.looked = now + LOOK_AGAIN_SECONDS if again else float("inf")
            if again and view.job and self._indexed_events(oid) is None:
                # (With the Events watches listed, the controller's Event wakes the job itself.)
                self._wake_at(f"look:{oid}", view.job, self._clock() + LOOK_AGAIN_SECONDS)
            if await self._look_for_evidence(oid, body, pods_too=unexplained):
                verdict = await self._classify_cached(oid, body)
        elif (any_event or running_once) and not annotated and oid in self._evidence:
            # An Event arrived since the last look (the watch woke the job): read from the index,
            # whatever the other Events watches have listed yet (each Event indexed wakes the job).
            # For a released object whose pods run once (no restart in place) too: the scheduler's
            # Preempted Event comes on a watch of a few Events, while the pod watch carries every
            # pod's every status and lags it by 5-15 s in a mass preemption (BENCHMARKS.md,
            # fifteenth round); the pod's own word would end it the same way, later.
            events = builtins.list(self._evidence[oid].values())
            found = event_evidence(self.kind, body, events)
            if found is not None and not any_event and found.cause.kind not in EARLY_EVENT_CAUSES:
                found = None  # its pods speak first: only a disruption of a live pod is read early
            if found is not None and self._keep_evidence(oid, [found]):
                verdict = await self._classify_cached(oid, body)
        return verdict

    async def _classify_cached(self, oid: str, body: Body) -> Verdict:
        state = self._state(oid)
        workload = self._workload_of(body)
        seen = sum(state.incarnations.values())
        key = (
            resource_version(body),
            tuple(sorted((k, p.version) for k, p in state.pods.items())),
            state.retained,
            state.last_restart,
            seen,
            workload.resource_version if workload is not None else None,
        )
        if state.verdict is not None and state.verdict[0] == key:
            return state.verdict[1]
        pods = state.pod_bodies()
        lost: set[str] = set()
        uses_nodes = False
        for pod in pods:
            if needs_node(pod):
                uses_nodes = True
                node = pod.get("spec", {}).get("nodeName")
                if node and await self._node_lost(node):
                    lost.add(node)
                elif node and state.job:
                    # Not lost yet: no event will say when it is (nodes are not watched), so look
                    # again once the lookup has expired from the node cache.
                    self._wake_at(f"node:{oid}", state.job, self._clock() + NODE_CACHE_SECONDS)
        verdict = classify(
            self.kind,
            body,
            pods,
            now=self._clock(),
            gone_nodes=lost,
            retained=state.retained,
            last_restart=state.last_restart,
            restarts_seen=seen,
            workload=workload,
        )
        if verdict.recheck_at is None and not uses_nodes and None not in key[:1]:
            kept_view(verdict.view)
            state.verdict = (key, verdict)  # neither the clock nor a node lookup can change it
        else:
            state.verdict = None
        return verdict

    async def _look_for_evidence(self, oid: str, body: Body, *, pods_too: bool) -> bool:
        """Ask the API server why ``oid``'s pods ended, when the cache cannot say; True if found.

        First (``pods_too``) the pods by label, read now (the pod watch may lag the object watch
        that brought the end). Then the events Kubernetes wrote on them, which outlive the pods
        (an hour by default), from the Events watches' index (read with a LIST only until those
        watches have listed once): the scheduler's ``Preempted``, the taint manager's
        ``TaintManagerEviction``, the kubelet's ``Evicted``, and the controller's
        ``create_failure_reason`` on the object (its pods can never be created). Only events from
        after the object was created count, so a reused name cannot inherit an old cause."""
        namespace, _ = split_id(oid, "object")
        state = self._state(oid)
        found: list[Evidence] = []
        try:
            if pods_too:
                owner = owner_of(body)
                if owner is not None:
                    selector = f"{LABEL_JOB}={owner[0].split('/', 1)[1]},{LABEL_SUBMISSION}={owner[1]}"
                    listing = await request(
                        self.api,
                        "GET",
                        f"/api/v1/namespaces/{namespace}/pods",
                        query={"labelSelector": selector},
                    )
                    for pod in listing.get("items") or []:
                        evidence, _ = kind_evidence(self.kind, body, pod, now=self._clock())
                        if evidence is not None and evidence.terminal:
                            found.append(evidence)
            if not found:
                events = self._indexed_events(oid)
                if events is None:  # the Events watches have not listed yet: read them
                    events = await self._disruption_events(namespace)
                evidence = event_evidence(self.kind, body, events)
                if evidence is not None:
                    found.append(evidence)
        except BackendError as error:
            self._log.debug("look for the evidence of %s: %s", oid, error)
            state.looked = 0.0  # try again on the next list()
            return False
        return self._keep_evidence(oid, found)

    def _keep_evidence(self, oid: str, found: builtins.list[Evidence]) -> bool:
        """Keep the best of ``found`` and what was kept before; True if that changed."""
        state = self._state(oid)
        kept = best([*found, *([state.retained] if state.retained is not None else [])])
        if kept is None or kept == state.retained:
            return False
        self._log.info("%s: %s found on the API server (%s)", oid, kept.cause.kind, kept.cause.detail)
        state.retained = kept
        return True

    async def _disruption_events(self, namespace: str) -> builtins.list[Body]:
        """The namespace's events that say why a pod was disrupted, read at most every few seconds.

        One read per namespace at a time: after a mass preemption every worker looks for evidence
        at once, and each would otherwise parse the same large listing (bench-operator: 55% of the
        operator's CPU at 1,000 jobs before this)."""
        now = time.monotonic()
        known = self._events.get(namespace)
        if known is not None and known[0] > now:
            return known[1]
        reading = self._events_reading.get(namespace)
        if reading is None:
            reading = asyncio.ensure_future(self._read_disruption_events(namespace, now))
            self._events_reading[namespace] = reading
            reading.add_done_callback(lambda _: self._events_reading.pop(namespace, None))
        return await asyncio.shield(reading)

    async def _read_disruption_events(self, namespace: str, now: float) -> builtins.list[Body]:
        items: builtins.list[Body] = []
        for kind, reason in evidence_events(self.kind):
            listing = await request(
                self.api,
                "GET",
                f"/api/v1/namespaces/{namespace}/events",
                query={"fieldSelector": f"involvedObject.kind={kind},reason={reason}"},
            )
            items.extend(listing.get("items") or [])
        self._events[namespace] = (now + EVENTS_CACHE_SECONDS, items)
        return items

    async def _node_lost(self, node: str) -> bool:
        """The node is gone (404) or not Ready: what ran on it cannot be reached."""
        now = time.monotonic()
        known = self._nodes.get(node)
        if known is not None and known[1] > now:
            return known[0]
        try:
            found = await request(self.api, "GET", f"/api/v1/nodes/{node}")
            lost = not node_ready(found)
        except KubeError as error:
            if error.status != 404:
                self._log.debug("cannot tell whether node %s exists: %s", node, error)
            lost = error.status == 404
        self._nodes[node] = (lost, now + NODE_CACHE_SECONDS)
        return lost

    # ---- stopping what the scheduler would carry on ----------------------------------------------

    def _stop_view(self, oid: str, body: Body, verdict: Verdict, view: ObjectView) -> ObjectView:
        """The view of an object this process stops (or must stop): ended with the stop's cause."""
        stop = self._state(oid).stop
        if stop is None:
            if not self.stop_ended:
                return view
            if verdict.stop is None:
                cause = view.cause
                if (
                    view.phase is Phase.ENDED
                    and cause is not None
                    and not view.cancelled
                    and self.stopped(body)
                    and self._unrecorded(body, cause)
                ):
                    # Finished by its controller for a reason only the pods gave: write it down
                    # before they go, so a restarted adapter reads the same cause.
                    stop = self._register_stop(oid, body, cause, deferrable=False)
                    if stop is not None:
                        self._ensure_stop_task(stop)
                return view
            stop = self._register_stop(oid, body, verdict.stop, after_grace=verdict.stop_after_grace)
            if stop is None:
                return view
        if view.phase is not Phase.ENDED or verdict.stop is not None:
            # Evidence seen once is final (a pod recreated before the stop lands does not revive
            # the object), and the view keeps the cause the annotation will say.
            # A stop with no cause is an object cancelled outside dispatch (a Workload deactivated
            # in Kueue): it stays a cancel, as the annotation will say.
            cancelled = stop.cause.kind is CauseKind.NONE
            view = view.model_copy(update={"phase": Phase.ENDED, "cause": stop.cause, "cancelled": cancelled})
        self._ensure_stop_task(stop)
        return view

    def _register_stop(
        self, oid: str, body: Body, cause: Cause, *, deferrable: bool | None = None, after_grace: bool = False
    ) -> _Stop | None:
        """``after_grace`` (``Verdict.stop_after_grace``): deferred, and settling waits for it."""
        state = self._state(oid)
        if state.stop is not None:
            return state.stop
        owner = owner_of(body)
        if owner is None:
            return None
        if after_grace:
            deferrable = True
        elif deferrable is None:
            failed_pod = any(
                p.get("status", {}).get("phase") == "Failed"
                and not p.get("metadata", {}).get("deletionTimestamp")
                for p in state.pod_bodies()
            )
            deferrable = failed_pod and not self.kind.in_place(body)
        stop = _Stop(oid, owner[0], owner[1], cause, deferrable=deferrable, settle_waits=after_grace)
        state.stop = stop
        self._index(oid, owner[0])
        return stop

    def _ensure_stop_task(self, stop: _Stop) -> None:
        """Start the stop's task with urgent writes (the write limit's first lane; a task keeps the
        context it was created in) wherever it is started, a watch event or a list(): it is the
        first write of a recovery, whose release waits for it (the fence), and nothing settles
        before it. Routine, a mass preemption's stops waited behind every other job's recovery
        writes, and so did each release."""
        if stop.landed or (stop.task is not None and not stop.task.done()):
            return
        with urgent(True):
            stop.task = self._spawn(self._run_stop(stop), f"dispatch-{self.kind.name}-stop-{stop.oid}")

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def _run_stop(self, stop: _Stop) -> None:
        """Write the stop (unless the API server already says it is stopped); never raises."""
        try:
            if stop.deferrable and self.stop_grace > 0 and not stop.now.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.stop_grace):
                        await stop.now.wait()
            failures = 0
            while True:
                body = self._current(stop.oid)
                if body is None:
                    break  # gone: nothing to write
                finished = self.stopped(body)
                if finished and not self._unrecorded(body, stop.cause):
                    break  # finished by its controller, and it says what the pods said
                try:
                    # On a finished object only the cause is written: the pods that said it are
                    # deleted soon (a preempted pod about a second later), the object stays.
                    await self._patch_stop(stop.oid, stop.cause, suspend=not finished)
                    break
                except TransientBackendError as error:
                    delay = STOP_RETRY[min(failures, len(STOP_RETRY) - 1)]
                    failures += 1
                    self._log.warning("stop %s: %s; again in %.2fs", stop.oid, error, delay)
                    await asyncio.sleep(delay)
            stop.landed = True
        except asyncio.CancelledError:
            raise
        except Exception as error:
            self._log.warning("stop %s: %s", stop.oid, error)
            stop.error = error

    def _stops_of(self, job: str) -> builtins.list[_Stop]:
        found = []
        for oid in self._ids_of(job):
            tracked = self._tracked.get(oid)
            if tracked is not None and tracked.stop is not None:
                found.append(tracked.stop)
        return found

    async def quiesce(self, job: str) -> None:
        """Before ``job`` is recorded settled (:class:`~dispatch._protocols.Quiescing`): every stop
        of its objects that their controller will not make itself (not deferrable) has landed, so
        that no object of a settled job can still run. Deferrable stops are the controller's own
        doing (but for ``settle_waits``); the fence in release() covers them all."""
        for stop in self._stops_of(job):
            if (stop.settle_waits or not stop.deferrable) and not stop.landed:
                await self._await_stop(stop)

    async def _await_stop(self, stop: _Stop, *, now: bool = False) -> None:
        """Wait until ``stop`` has landed, starting (or restarting) it if needed."""
        if now:
            stop.now.set()
        stop.error = None
        self._ensure_stop_task(stop)
        if stop.task is not None and not stop.landed:
            await asyncio.shield(stop.task)
        if not stop.landed:
            error = stop.error
            if isinstance(error, BackendError):
                raise error
            raise TransientBackendError(f"stop {stop.oid}: {error or 'not done yet'}")

    async def _fence(self, job: str, submission: int, releasing: str) -> None:
        """Make sure no object of ``job`` older than ``submission`` can run any more.

        An object counts as stopped only by what the API server says for good (annotation,
        finished, being deleted: :meth:`stopped`), so a stale cache can only cause a redundant
        write, never a second released object. Objects this process has never seen (deleted before
        it started, or not yet in its watch) are looked up with one read.
        """
        namespace, job_name = split_id(job)
        seen: set[int] = set()
        for oid in sorted(self._ids_of(job)):
            body = self._current(oid)
            owner = owner_of(body) if body is not None else None
            if body is None or owner is None or oid == releasing:
                continue
            seen.add(owner[1])
            if owner[1] < submission and not self.stopped(body):
                await self._stop_now(oid, body, submission)
        missing = [
            k
            for k in range(1, submission)
            if k not in seen and f"{namespace}/{object_name(job_name, k)}" not in self._tombstones
        ]
        if not missing:
            return
        listing = await self._list_query(
            self._path(namespace), {"labelSelector": f"{LABEL_JOB}={job_name},{SELECTOR}"}
        )
        for item in listing.get("items") or []:
            owner = owner_of(item)
            oid = key_of(item)
            if owner is None or owner[0] != job or owner[1] >= submission or oid == releasing:
                continue
            if not self.stopped(item):
                self._remember(oid, job, item)
                await self._stop_now(oid, item, submission)

    async def _stop_now(self, oid: str, body: Body, submission: int) -> None:
        stop = self._state(oid).stop
        if stop is None:
            verdict = await self._classify(oid, body)
            cause = verdict.stop or Cause(
                kind=CauseKind.UNKNOWN,
                detail=f"stopped by dispatch before submission {submission} of the job was released",
            )
            stop = self._register_stop(oid, body, cause)
            if stop is None:
                return
        if stop.landed and not self.stopped(self._current(oid) or body):
            stop.landed = False  # it was gone from our cache, but the API server still has it
        self._log.info("release of submission %d waits for the stop of %s", submission, oid)
        await self._await_stop(stop, now=True)

    def _unrecorded(self, body: Body, cause: Cause) -> bool:
        """The API server does not keep ``cause`` on this finished object: no annotation, not being
        deleted, and the object alone (its status, without the pods) says something else."""
        meta = body.get("metadata", {})
        if (meta.get("annotations") or {}).get(ANNOTATION_ENDED) or meta.get("deletionTimestamp"):
            return False
        alone = classify(self.kind, body, (), now=self._clock()).view.cause
        return alone is None or alone.kind is not cause.kind

    async def _patch_stop(self, oid: str, cause: Cause, *, suspend: bool = True) -> None:
        """One merge patch: the cause into ``dispatch.dev/ended`` and the kind's suspend (its
        controller then deletes the pods and creates no more). No resourceVersion: it only ever moves
        the object towards stopped, so it cannot undo anyone's write that matters, and a status
        update by the controller does not make it fail with 409. A release racing with it is
        conditional (resourceVersion) and refuses once the annotation is there."""
        namespace, name = split_id(oid, "object")
        body = self._current(oid)
        queued = stop_patch(body) if body is not None and suspend else {}
        patch: Body = {**(self.kind.suspend_patch(True) if suspend else {})}
        patch["metadata"] = {
            **queued.get("metadata", {}),
            "annotations": {ANNOTATION_ENDED: ended_annotation(cause)},
        }
        try:
            patched = await request(
                self.api, "PATCH", self._path(namespace, name), body=patch, content_type=MERGE_PATCH
            )
        except KubeError as error:
            if error.status == 404:
                return
            raise explain(error, f"stop {self._noun} {oid}") from None
        self._log.info("%s %s: %s (%s)", "stopped" if suspend else "recorded", oid, cause.kind, cause.detail)
        self._remember(oid, None, patched)
        if queued:
            # Deleting it deletes its Workload, so Kueue can neither requeue nor restart it; the
            # finalizer keeps the object (and the cause) until the record has it. Retried here: once
            # the annotation is there the stop counts as landed, and nothing else would delete it.
            for delay in (*STOP_RETRY, None):
                try:
                    await self._delete(namespace, name)
                    break
                except TransientBackendError as error:
                    if delay is None:
                        raise
                    self._log.warning("delete stopped %s: %s; again in %.2fs", oid, error, delay)
                    await asyncio.sleep(delay)
        if suspend:
            self._schedule_cleanup(oid)

    def _schedule_cleanup(self, oid: str) -> None:
        """The controller deletes a suspended object's pods; if some still run after
        ``pod_cleanup_after`` (no controller, or a stuck one), delete them ourselves."""
        key = f"cleanup:{oid}"
        if key in self._timers:
            return

        def fire() -> None:
            self._timers.pop(key, None)
            self._spawn(self._cleanup_pods(oid), f"dispatch-{self.kind.name}-cleanup-{oid}")

        self._timers[key] = asyncio.get_running_loop().call_later(self.pod_cleanup_after, fire)

    async def _cleanup_pods(self, oid: str) -> None:
        """Each pod the watch still shows running is deleted by name: a pod already gone answers
        404 at no cost, where a DELETE by label selector makes the API server scan every pod of the
        namespace (at 10,000 jobs, a mass preemption's lagging pod watch sent hundreds of those and
        they answered 504: BENCHMARKS.md, sixteenth round)."""
        tracked = self._tracked.get(oid)
        alive = [
            p
            for p in (tracked.pod_bodies() if tracked is not None else ())
            if not p.get("metadata", {}).get("deletionTimestamp")
            and p.get("status", {}).get("phase") in ("Running", "Pending")
        ]
        if not alive:
            return
        self._log.info("%d pod(s) of stopped %s still run: deleting them", len(alive), oid)
        for pod in alive:
            meta = pod.get("metadata", {})
            try:
                await self._delete_pod(meta.get("namespace", ""), meta.get("name", ""))
            except BackendError as error:  # a 5xx or a dropped connection too: logged, not retried
                self._log.warning("delete pod %s of stopped %s: %s", meta.get("name"), oid, error)

    def _check_stop(self, oid: str) -> None:
        """From the watches: start a stop as soon as the evidence arrives, for the jobs someone in
        this process supervises (never for others: a standby operator writes nothing)."""
        if not self.stop_ended or not self._tasks:
            return
        body = self._current(oid)
        if body is None:
            return
        state = self._state(oid)
        stop = state.stop
        if stop is not None:
            if self.stopped(body):
                stop.now.set()  # a deferred stop has nothing left to write
            return
        owner = owner_of(body)
        if owner is None or not self._subscribers.get(owner[0]):
            return
        if self.stopped(body) or state.ended_by_us or state.sweeping:
            return
        if self._verdict_now(oid, body).stop is None:
            return
        state.sweeping = True
        self._spawn(self._sweep(oid), f"dispatch-{self.kind.name}-sweep-{oid}")

    async def _sweep(self, oid: str) -> None:
        try:
            body = self._current(oid)
            if body is None or self._state(oid).stop is not None:
                return
            verdict = await self._classify(oid, body)
            if verdict.stop is not None and self._state(oid).stop is None:
                stop = self._register_stop(oid, body, verdict.stop, after_grace=verdict.stop_after_grace)
                if stop is not None:
                    self._ensure_stop_task(stop)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            self._log.debug("sweep %s: %s", oid, error)
        finally:
            tracked = self._tracked.get(oid)
            if tracked is not None:
                tracked.sweeping = False

    # ---- writes ------------------------------------------------------------------------------

    async def _let_go(self, namespace: str, name: str, body: Body | None) -> None:
        """Remove dispatch's finalizer (a JSON patch with a test, so no other finalizer is touched)."""
        for attempt in range(5):
            if body is None or attempt:
                body = await self._get(namespace, name)
                if body is None:
                    return
            finalizers = builtins.list(body.get("metadata", {}).get("finalizers") or ())
            if OBJECT_FINALIZER not in finalizers:
                return
            at = f"/metadata/finalizers/{finalizers.index(OBJECT_FINALIZER)}"
            patch = [{"op": "test", "path": at, "value": OBJECT_FINALIZER}, {"op": "remove", "path": at}]
            try:
                patched = await request(
                    self.api, "PATCH", self._path(namespace, name), body=patch, content_type=JSON_PATCH
                )
            except KubeError as error:
                if error.status == 404:
                    return
                if error.status in (409, 422):
                    continue  # the list changed since read: read again
                raise explain(error, f"remove the finalizer of {self._noun} {namespace}/{name}") from None
            self._remember(f"{namespace}/{name}", None, patched)
            return
        raise TransientBackendError(
            f"remove the finalizer of {self._noun} {namespace}/{name}: it kept changing"
        )

    async def _delete(self, namespace: str, name: str) -> None:
        try:
            deleted = await request(
                self.api, "DELETE", self._path(namespace, name), query={"propagationPolicy": "Background"}
            )
        except KubeError as error:
            if error.status != 404:
                raise explain(error, f"delete {self._noun} {namespace}/{name}") from None
            return
        meta = deleted.get("metadata") or {}
        if meta.get("deletionTimestamp") and OBJECT_FINALIZER in (meta.get("finalizers") or ()):
            # Held by our finalizer (a stopped queued object): shown retained at once, not when the
            # watch brings it, so the job is not recorded settled before an End lets go of it (the
            # object would stay, its Workload with it, and Kueue admitted it again).
            self._remember(f"{namespace}/{name}", None, deleted)

    async def _delete_pod(self, namespace: str, name: str) -> None:
        try:
            await request(self.api, "DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}")
        except KubeError as error:
            if error.status != 404:
                raise explain(error, f"delete pod {namespace}/{name}") from None

    async def _delete_pods(self, namespace: str, name: str, body: Body | None) -> None:
        owner = owner_of(body) if body is not None else None
        if owner is not None:
            job_name, n = owner[0].split("/", 1)[1], owner[1]
        else:
            job_name, _, tail = name.rpartition("-")
            if not job_name or not tail.isdigit():
                return
            n = int(tail)
        selector = f"{LABEL_JOB}={job_name},{LABEL_SUBMISSION}={n}"
        try:
            await request(
                self.api, "DELETE", f"/api/v1/namespaces/{namespace}/pods", query={"labelSelector": selector}
            )
        except KubeError as error:
            if error.status != 404:
                raise explain(error, f"delete the pods of {self._noun} {namespace}/{name}") from None

    async def _get(self, namespace: str, name: str) -> Body | None:
        try:
            return await request(self.api, "GET", self._path(namespace, name))
        except KubeError as error:
            if error.status == 404:
                return None
            raise explain(error, f"read {self._noun} {namespace}/{name}") from None

    async def _list_query(self, path: str, query: Mapping[str, object]) -> Body:
        try:
            return await request(self.api, "GET", path, query=query)
        except KubeError as error:
            raise explain(error, f"list {path}") from None

    def _path(self, namespace: str | None, name: str | None = None) -> str:
        return self.kind.resource.path(namespace, name)

    # ---- for tests and benchmarks -------------------------------------------------------------

    def watch_events(self) -> int:
        """How many watch events the shared watches have delivered (not counting lists)."""
        events = (i for informers in self._event_informers.values() for i in informers)
        return sum(i.events for i in self._informers) + sum(i.events for i in events)

"""The Kubeflow adapter: each submission of a DispatchJob is one PyTorchJob (``kubeflow.org/v1``).

See docs/kubeflow.md. Object ids are ``"<namespace>/<pytorchjob name>"``; job ids are
``"<namespace>/<name>"`` of a DispatchJob.

One list+watch per resource (PyTorchJobs and pods labelled ``app.kubernetes.io/managed-by=dispatch``)
feeds an in-memory cache shared by every job; each event wakes the subscribers of the job it belongs
to, so the path from a pod or PyTorchJob change to the supervisor's next decision never polls.
:meth:`KubeflowBackend.list` answers from that cache once it has synced, completed by what this
process wrote itself (an object it created is shown even before the watch brings it back).

Stopping an object whose pods say it has ended (the suspend patch with ``dispatch.dev/ended``) is off
the reaction path: the object is reported ended as soon as the evidence is seen, the stop runs in a
background task per object, and :meth:`KubeflowBackend.release` first makes sure that every older
object of the same job is stopped on the API server (the *fence*), so "at most one released object
per job" holds without the supervisor waiting for the stop before it authorizes and creates the next
submission. See docs/kubeflow.md, "Stopping what the scheduler would carry on".
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from kubernetes_asyncio.client import ApiClient

from .._capabilities import KUBEFLOW as KUBEFLOW_CAPABILITIES
from .._config import flag
from .._constants import (
    ANNOTATION_ENDED,
    GROUP,
    KUBEFLOW_GROUP,
    KUBEFLOW_VERSION,
    LABEL_JOB,
    LABEL_MANAGED_BY,
    LABEL_SUBMISSION,
    MANAGED_BY,
    OBJECT_FINALIZER,
    PLURAL,
    PYTORCHJOB_PLURAL,
    VERSION,
)
from .._errors import BackendError, ObjectExists, TransientBackendError
from .._model import (
    Action,
    Capabilities,
    Cause,
    CauseKind,
    Enforcer,
    JobSpec,
    ObjectView,
    Phase,
    Plan,
)
from .._protocols import Unsubscribe, Wake
from ._build import Refused, build, object_name
from ._classify import (
    EVIDENCE_EVENTS,
    Evidence,
    Verdict,
    best,
    classify,
    container_restarts,
    ended_annotation,
    event_evidence,
    in_place,
    needs_node,
    no_capacity_after,
    node_ready,
    owner_of,
    parse_time,
    pod_evidence,
    restart_budget,
    vanished,
)
from ._http import JSON_PATCH, MERGE_PATCH, Body, KubeError, request
from ._informer import Informer, key_of, resource_version

log = logging.getLogger("dispatch.kubeflow")

CAPABILITIES: Final = KUBEFLOW_CAPABILITIES
"""What Kubeflow enforces natively; defined once in dispatch._capabilities."""
SELECTOR: Final = f"{LABEL_MANAGED_BY}={MANAGED_BY}"
MAX_TOMBSTONES: Final = 10_000
NODE_CACHE_SECONDS: Final = 10.0
EVENTS_CACHE_SECONDS: Final = 2.0
LOOK_AGAIN_SECONDS: Final = 3.0
PODLESS_AFTER_SECONDS: Final = 2.0
STOP_RETRY: Final = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


@dataclass(eq=False)
class _Stop:
    """A stop this process has decided on: the object is reported ended with ``cause`` from then on."""

    oid: str
    job: str
    submission: int
    cause: Cause
    deferrable: bool
    """The training operator finishes the object itself (a failed pod under restartPolicy Never):
    the patch waits up to ``stop_grace`` for that, unless a release needs the object stopped now."""
    now: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    landed: bool = False
    """The object is stopped on the API server (by us or the training operator) or gone."""
    reported: bool = False
    """``list()`` has shown it ended: every later ``list()`` waits for a stop that cannot be deferred."""
    error: Exception | None = None


def resubmitted_causes(spec: JobSpec, plan: Plan) -> frozenset[CauseKind]:
    """The causes whose end of this submission the supervisor answers with a new submission (the
    same test as ``decide``). Firings of resubmit rules change only by authorizing a submission, so
    the plan given to ``create`` still holds when the object ends."""
    kinds: set[CauseKind] = set()
    for kind in CauseKind:
        index = spec.recovery.rule_for(kind)
        if index is None or index >= len(plan.rules):
            continue
        rule = plan.rules[index]
        if rule.enforcer is Enforcer.SUPERVISOR and rule.action is Action.RESUBMIT and rule.left > 0:
            kinds.add(kind)
    return frozenset(kinds)


def stopped_body(body: Body) -> bool:
    """The API server says this PyTorchJob can run nothing any more, for good: stopped by dispatch
    (the annotation), finished (``Succeeded``/``Failed``: the training operator cleans its running pods
    and creates none), or being deleted. None of these can be undone by dispatch or Kubeflow."""
    meta = body.get("metadata", {})
    if (meta.get("annotations") or {}).get(ANNOTATION_ENDED) or meta.get("deletionTimestamp"):
        return True
    return any(
        c.get("type") in ("Succeeded", "Failed") and c.get("status") == "True"
        for c in body.get("status", {}).get("conditions") or []
    )


def refused_for_good(error: KubeError) -> bool:
    """The API server (or an admission webhook, such as the training operator's validator) refused
    the object itself: sending it again can only be refused again."""
    if error.status in (400, 413, 422):
        return True
    return error.status == 403 and "denied the request" in error.message


def split_id(value: str, what: str = "job") -> tuple[str, str]:
    namespace, sep, name = value.partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise BackendError(f"a Kubeflow {what} id is '<namespace>/<name>', not {value!r}")
    return namespace, name


class KubeflowBackend:
    """A :class:`~dispatch.Backend` running each submission as a PyTorchJob."""

    def __init__(
        self,
        api: ApiClient,
        *,
        namespaces: Sequence[str] | None = None,
        stop_ended: bool = True,
        sync_timeout: float = 30.0,
        stop_grace: float = 2.0,
        pod_cleanup_after: float = 30.0,
        owns_api: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``namespaces`` limits the watches (default: all namespaces). ``stop_ended=False`` makes a
        read-only observer: it never stops an object whose pods say it has ended. ``stop_grace``: how
        long a stop the training operator will make itself (a failed pod under ``Never``) waits for it
        before dispatch writes it. ``pod_cleanup_after``: how long after a stop the pods the training
        operator should have deleted may still run before dispatch deletes them itself."""
        self.api = api
        self.namespaces = tuple(namespaces) if namespaces else None
        self.stop_ended = stop_ended
        self.sync_timeout = sync_timeout
        self.stop_grace = stop_grace
        self.pod_cleanup_after = pod_cleanup_after
        self._owns_api = owns_api
        self._clock = clock
        self._born = clock()
        self._subscribers: dict[str, list[Wake]] = {}
        self._informers: list[Informer] = []
        self._pj_informers: list[Informer] = []
        self._pod_informers: list[Informer] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._pjs: dict[str, Body] = {}  # object id -> PyTorchJob (from the watch)
        self._by_job: dict[str, set[str]] = {}  # job id -> object ids
        self._pods: dict[str, dict[str, Body]] = {}  # object id -> pod key -> pod
        self._overlay: dict[str, Body] = {}  # object id -> the body of our own last write
        self._overlay_job: dict[str, str] = {}
        self._ended_by_us: dict[str, str] = {}  # object id -> job id
        self._tombstones: OrderedDict[str, ObjectView] = OrderedDict()
        self._last_views: dict[str, ObjectView] = {}
        self._retained: dict[str, Evidence] = {}
        self._last_restart: dict[str, Cause] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._nodes: dict[str, tuple[bool, float]] = {}
        self._restarts: dict[str, int] = {}  # object id -> most restarts seen (pods are recreated)
        self._stops: dict[str, _Stop] = {}  # object id -> the stop decided on (pending or landed)
        self._background: set[asyncio.Task[None]] = set()
        self._sweeping: set[str] = set()
        self._verdicts: dict[str, tuple[tuple[object, ...], Verdict]] = {}
        self._resubmits: dict[str, frozenset[CauseKind]] = {}  # object id -> causes its plan resubmits
        self._refused: dict[str, ObjectView] = {}  # object id -> a create refused for good (never existed)
        self._early: OrderedDict[str, list[Body]] = OrderedDict()  # pods seen before their object
        self._incarnations: dict[str, dict[str, int]] = {}  # object id -> pod uid -> most restarts seen
        self._released_at: dict[str, float] = {}  # object id -> when this process released it
        self._looked: dict[str, float] = {}  # object id -> when its evidence may be looked for again
        self._events: dict[str, tuple[float, list[Body]]] = {}  # namespace -> (until, disruption events)

    # ---- Backend protocol ------------------------------------------------------------------

    @property
    def name(self) -> str:
        return "kubeflow"

    @property
    def capabilities(self) -> Capabilities:
        return CAPABILITIES

    async def create(self, job: str, submission: int, spec: JobSpec, plan: Plan) -> str:
        namespace, job_name = split_id(job)
        self._start()
        owner = await self._call(
            "GET",
            f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{job_name}",
            what=f"DispatchJob {job}",
        )
        uid = owner.get("metadata", {}).get("uid")
        if not uid:
            raise BackendError(f"DispatchJob {job} has no uid")
        oid = f"{namespace}/{object_name(job_name, submission)}"
        try:
            body = build(
                namespace=namespace,
                job_name=job_name,
                submission=submission,
                spec=spec,
                plan=plan,
                owner_uid=uid,
            )
        except Refused as refused:
            return self._refuse(oid, job, submission, f"not created: {refused}")
        try:
            created = await request(self.api, "POST", self._pj_path(namespace), body=body)
        except KubeError as error:
            if error.status == 409:
                raise ObjectExists(oid) from None
            if refused_for_good(error):
                return self._refuse(oid, job, submission, f"the API server refused it: {error.message}")
            raise self._explain(error, f"create PyTorchJob {oid}") from None
        self._remember(oid, job, created)
        self._resubmits[oid] = resubmitted_causes(spec, plan)
        return oid

    def _refuse(self, oid: str, job: str, submission: int, detail: str) -> str:
        """A submission that can never run: reported ended ``launch-failed`` under the name it would
        have had, so the job says why within the same reaction instead of retrying a create that will
        be refused again. In memory only: after a restart the canonical is missing, which the
        supervisor's decision treats as ended as well."""
        cause = Cause(kind=CauseKind.LAUNCH_FAILED, detail=detail[:1024])
        log.warning("PyTorchJob %s %s", oid, detail)
        self._refused[oid] = ObjectView(
            id=oid, job=job, submission=submission, phase=Phase.ENDED, cause=cause
        )
        self._wake(job)
        return oid

    async def release(self, object_id: str) -> None:
        namespace, name = split_id(object_id, "object")
        body = self._current(object_id)
        if body is None:
            body = await self._get_pj(namespace, name)
            if body is None:
                log.info("release %s: it no longer exists", object_id)
                return
            self._remember(object_id, None, body)
        owner = owner_of(body)
        if owner is not None:
            # Invariant 1 without waiting on the hot path: the older objects of the job are stopped
            # on the API server before this one may start (usually the stop landed long ago).
            await self._fence(owner[0], owner[1], object_id)
            body = self._current(object_id)
        for _ in range(5):
            if body is None:
                body = await self._get_pj(namespace, name)
                if body is None:
                    log.info("release %s: it no longer exists", object_id)
                    return
            annotations = body.get("metadata", {}).get("annotations") or {}
            run_policy = body.get("spec", {}).get("runPolicy") or {}
            if (
                annotations.get(ANNOTATION_ENDED)
                or not run_policy.get("suspend")
                or body["metadata"].get("deletionTimestamp")
            ):
                return  # already released, or ended: never unsuspend what dispatch has stopped
            patch = {
                "metadata": {"resourceVersion": body["metadata"]["resourceVersion"]},
                "spec": {"runPolicy": {"suspend": False}},
            }
            try:
                patched = await request(
                    self.api, "PATCH", self._pj_path(namespace, name), body=patch, content_type=MERGE_PATCH
                )
            except KubeError as error:
                if error.status == 404:
                    return
                if error.status == 409:
                    body = None  # changed since read: read again and decide again
                    continue
                raise self._explain(error, f"release PyTorchJob {object_id}") from None
            self._remember(object_id, None, patched)
            self._released_at[object_id] = self._clock()
            return
        raise TransientBackendError(f"release {object_id}: it kept changing under us")

    async def end(self, object_id: str) -> None:
        namespace, name = split_id(object_id, "object")
        stop = self._stops.get(object_id)
        if stop is not None and stop.task is not None and not stop.task.done():
            # Deleting supersedes a stop in flight (or waiting for the training operator).
            stop.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await stop.task
        body = self._current(object_id)
        owner = owner_of(body) if body is not None else None
        # Ours to let go of first: once deleted, this process no longer lists it as held by it.
        await self._let_go(namespace, name, body)
        try:
            await request(
                self.api, "DELETE", self._pj_path(namespace, name), query={"propagationPolicy": "Background"}
            )
        except KubeError as error:
            if error.status != 404:
                raise self._explain(error, f"delete PyTorchJob {object_id}") from None
        if owner is not None:
            self._ended_by_us[object_id] = owner[0]
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
            body = await self._get_pj(namespace, name)
            owner = owner_of(body) if body is not None else None
            if body is not None and owner is not None and owner[0] == job:
                log.info(
                    "job %s: canonical %s found on the API server before the watch showed it", job, object_id
                )
                self._remember(object_id, job, body)
        return await self.list(job)

    async def list(self, job: str) -> Sequence[ObjectView]:
        split_id(job)
        await self._synced()
        # A job must not record Settled while one of its objects could still run, so a stop that
        # the training operator will not make itself (not deferrable) is awaited by every list()
        # but one: the first to report it, when this process created the object and its plan
        # makes that cause a resubmission (the next step is an Authorize, not an outcome; the
        # Create after it waits, the stop having had the write's time to land). Deferrable stops
        # are made by the training operator itself; the fence in release() covers them all.
        await self._await_stops(job)
        views: list[ObjectView] = []
        for oid in sorted(self._ids_of(job)):
            if oid in self._tombstones:
                continue
            body = self._current(oid)
            if body is None:
                continue
            verdict = await self._classify(oid, body)
            view = verdict.view
            seen = self._restarts.get(oid, 0)
            counted = sum(self._incarnations.get(oid, {}).values())
            if counted:
                budget = restart_budget(body)
                seen = max(seen, min(counted, budget) if budget is not None else counted)
            if view.restarts < seen:
                view = view.model_copy(update={"restarts": seen})
            else:
                self._restarts[oid] = view.restarts
            view = vanished(view) if oid in self._ended_by_us else self._stop_view(oid, body, verdict, view)
            stop = self._stops.get(oid)
            if stop is not None and not stop.landed and not stop.deferrable and not stop.reported:
                stop.reported = True
                if stop.cause.kind not in self._resubmits.get(oid, ()):
                    await self._await_stop(stop)
            self._last_views[oid] = view
            if verdict.recheck_at is not None:
                self._wake_at(f"recheck:{oid}", job, verdict.recheck_at)
            views.append(view)
        views.extend(v for v in self._tombstones.values() if v.job == job)
        views.extend(v for v in self._refused.values() if v.job == job)
        views = [self._terminating(v) for v in views]
        views.sort(key=lambda v: (v.submission, v.id))
        return views

    def _terminating(self, view: ObjectView) -> ObjectView:
        """Ended, but a pod of it still runs (a deletion's grace period, a stop the training operator
        has not carried out yet): the job must not settle yet. A pod being deleted on a lost node is
        not waited for: no kubelet will ever confirm it."""
        if view.phase is not Phase.ENDED:
            return view
        now = time.monotonic()
        lost = {node for node, (is_lost, until) in self._nodes.items() if is_lost and until > now}
        for pod in self._pods.get(view.id, {}).values():
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
        if self._owns_api:
            await self.api.close()

    # ---- the cache ---------------------------------------------------------------------------

    def _start(self) -> None:
        if self._tasks:
            return
        loop = asyncio.get_running_loop()
        scopes: Sequence[str | None] = self.namespaces or (None,)
        for ns in scopes:
            pj = Informer(
                self.api,
                self._pj_path(ns),
                label_selector=SELECTOR,
                on_change=self._pj_changed,
                on_relist=self._pj_relisted,
                what=f"PyTorchJobs{' in ' + ns if ns else ''}",
            )
            pods = Informer(
                self.api,
                f"/api/v1/namespaces/{ns}/pods" if ns else "/api/v1/pods",
                label_selector=SELECTOR,
                on_change=self._pod_changed,
                what=f"pods{' in ' + ns if ns else ''}",
            )
            self._pj_informers.append(pj)
            self._pod_informers.append(pods)
        self._informers = [*self._pj_informers, *self._pod_informers]
        self._tasks = [loop.create_task(i.run(), name=f"dispatch-kubeflow-{i.what}") for i in self._informers]

    async def _synced(self) -> None:
        self._start()
        pending = [i for i in self._informers if not i.synced.is_set()]
        if not pending:
            return
        try:
            async with asyncio.timeout(self.sync_timeout):
                await asyncio.gather(*(i.synced.wait() for i in pending))
        except TimeoutError:
            reasons = "; ".join(f"{i.what}: {i.last_error}" for i in pending if i.last_error) or "no answer"
            hint = ""
            if any(isinstance(i.last_error, KubeError) and i.last_error.status == 404 for i in pending):
                hint = f" (is the PyTorchJob CRD {PYTORCHJOB_PLURAL}.{KUBEFLOW_GROUP} installed?)"
            raise TransientBackendError(f"the Kubeflow watches have not synced: {reasons}{hint}") from None

    def _pj_changed(self, old: Body | None, new: Body | None) -> None:
        body = new if new is not None else old
        if body is None:
            return
        oid = key_of(body)
        owner = owner_of(body)
        job = owner[0] if owner is not None else None
        if new is None:
            self._pjs.pop(oid, None)
            if job is not None:
                self._by_job.get(job, set()).discard(oid)
                last = self._last_views.get(oid)
                if last is None:
                    last = self._classify_now(oid, body)
                self._tombstone(vanished(last))
            self._forget(oid)
        else:
            self._pjs[oid] = new
            if job is not None:
                self._by_job.setdefault(job, set()).add(oid)
            for pod in self._early.pop(oid, ()):
                self._retain(oid, new, pod)
            mine = self._overlay.get(oid)
            if mine is not None and (resource_version(new) or 0) >= (resource_version(mine) or 0):
                self._overlay.pop(oid, None)
                self._overlay_job.pop(oid, None)
            self._check_stop(oid)
        self._wake(job)

    def _pj_relisted(self, rv: str) -> None:
        """Our own writes older than a fresh list and missing from it were deleted meanwhile."""
        try:
            listed = int(rv)
        except ValueError:
            return
        for oid, body in list(self._overlay.items()):
            if oid not in self._pjs and (resource_version(body) or 0) <= listed:
                self._pj_changed(body, None)

    def _pod_changed(self, old: Body | None, new: Body | None) -> None:
        body = new if new is not None else old
        if body is None:
            return
        owner = owner_of(body)
        if owner is None:
            return
        job, n = owner
        namespace, job_name = job.split("/", 1)
        oid = f"{namespace}/{object_name(job_name, n)}"
        pod_key = key_of(body)
        pj = self._current(oid)
        if new is None:
            self._pods.get(oid, {}).pop(pod_key, None)
            timer = self._timers.pop(f"pod:{pod_key}", None)
            if timer is not None:
                timer.cancel()
            if pj is not None:
                self._retain(oid, pj, body)
            else:
                self._keep_early(oid, body)
        else:
            self._pods.setdefault(oid, {})[pod_key] = new
            if pj is None:
                self._keep_early(oid, new)
            else:
                self._retain(oid, pj, new)
                _, at = pod_evidence(
                    new,
                    restarts_in_place=in_place(pj),
                    now=self._clock(),
                    no_capacity_after_seconds=no_capacity_after(pj),
                )
                if at is not None:
                    self._wake_at(f"pod:{pod_key}", job, at)
        if pj is not None:
            self._check_stop(oid)
        self._wake(job)

    def _keep_early(self, oid: str, pod: Body) -> None:
        """The pod watch is ahead of the PyTorchJob watch: keep every word of the pod until its
        PyTorchJob arrives (a preempted pod is deleted about a second after it says why; the
        container's lastState is replaced once it is terminated)."""
        self._early.setdefault(oid, []).append(pod)
        self._early.move_to_end(oid)
        while len(self._early) > MAX_TOMBSTONES:
            self._early.popitem(last=False)

    def _retain(self, oid: str, pj: Body, pod: Body) -> None:
        """Keep what a pod said about the end of its object, for when the pod is gone, and how often
        each incarnation of it was restarted in place (a recreated pod starts again from 0)."""
        restarted = False
        if in_place(pj):
            uid = pod.get("metadata", {}).get("uid") or key_of(pod)
            counts = self._incarnations.setdefault(oid, {})
            count = container_restarts(pod)
            if count > counts.get(uid, 0):
                counts[uid] = count
                restarted = True
        found, _ = pod_evidence(
            pod,
            restarts_in_place=in_place(pj),
            now=self._clock(),
            no_capacity_after_seconds=no_capacity_after(pj),
        )
        if found is None or found.cause.kind is CauseKind.NO_CAPACITY:
            return
        if not found.terminal:
            # The restart that reached the backoff limit is the last one *made*, not the last pod
            # update that still shows an older lastState.
            if restarted or oid not in self._last_restart:
                self._last_restart[oid] = found.cause
        else:
            # Kept at once, not only when the pod is deleted: the pod may change a moment later
            # (a deletion's SIGTERM replaces the container's state) before it goes.
            kept = best(e for e in (self._retained.get(oid), found) if e is not None)
            if kept is not None:
                self._retained[oid] = kept

    def _forget(self, oid: str) -> None:
        self._overlay.pop(oid, None)
        self._overlay_job.pop(oid, None)
        self._ended_by_us.pop(oid, None)
        self._retained.pop(oid, None)
        self._last_restart.pop(oid, None)
        self._last_views.pop(oid, None)
        self._restarts.pop(oid, None)
        self._verdicts.pop(oid, None)
        self._resubmits.pop(oid, None)
        self._looked.pop(oid, None)
        self._released_at.pop(oid, None)
        self._early.pop(oid, None)
        self._incarnations.pop(oid, None)
        stop = self._stops.pop(oid, None)
        if stop is not None:
            stop.landed = True  # gone from the API server: nothing of it can run
            stop.now.set()
        for key in (f"recheck:{oid}", f"cleanup:{oid}"):
            timer = self._timers.pop(key, None)
            if timer is not None:
                timer.cancel()

    def _tombstone(self, view: ObjectView) -> None:
        self._tombstones[view.id] = view
        self._tombstones.move_to_end(view.id)
        while len(self._tombstones) > MAX_TOMBSTONES:
            self._tombstones.popitem(last=False)

    def _remember(self, oid: str, job: str | None, body: Body) -> None:
        """Our own write: newer than the cache until the watch brings it (or something newer) back."""
        cached = self._pjs.get(oid)
        if cached is not None and (resource_version(cached) or 0) >= (resource_version(body) or 0):
            return
        self._overlay[oid] = body
        owner = owner_of(body)
        self._overlay_job[oid] = job if job is not None else (owner[0] if owner is not None else "")
        self._tombstones.pop(oid, None)

    def _current(self, oid: str) -> Body | None:
        cached = self._pjs.get(oid)
        mine = self._overlay.get(oid)
        if mine is None:
            return cached
        if cached is None or (resource_version(mine) or 0) > (resource_version(cached) or 0):
            return mine
        return cached

    def _ids_of(self, job: str) -> set[str]:
        ids = set(self._by_job.get(job, ()))
        ids.update(oid for oid, j in self._overlay_job.items() if j == job)
        ids.update(oid for oid, j in self._ended_by_us.items() if j == job)
        return ids

    def _wake(self, job: str | None) -> None:
        if job is None:
            return
        for wake in list(self._subscribers.get(job, ())):
            wake()

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

    # ---- classification ----------------------------------------------------------------------

    def _classify_now(self, oid: str, body: Body) -> ObjectView:
        return self._verdict_now(oid, body).view

    def _verdict_now(self, oid: str, body: Body) -> Verdict:
        """Without I/O: nodes are taken as present unless this process already found them gone."""
        now = time.monotonic()
        gone = {node for node, (is_gone, until) in self._nodes.items() if is_gone and until > now}
        return classify(
            body,
            list(self._pods.get(oid, {}).values()),
            now=self._clock(),
            gone_nodes=gone,
            retained=self._retained.get(oid),
            last_restart=self._last_restart.get(oid),
        )

    async def _classify(self, oid: str, body: Body) -> Verdict:
        """The verdict on one object; remembered while nothing it was computed from has changed
        (a job's list() classifies every object it ever had, many times per recovery).

        When the cache holds no reason for an object's end (the pods are gone, the pod watch lags
        the PyTorchJob watch, or this process started after the fact), the API server is asked once:
        the pods themselves, then the disruption events Kubernetes recorded on them (see
        :meth:`_look_for_evidence`). A released object restarting pods in place is looked at once per
        process the same way, since the training operator recreates a preempted pod by itself."""
        verdict = await self._classify_cached(oid, body)
        view = verdict.view
        unexplained = (
            view.phase is Phase.ENDED
            and view.cause is not None
            and (view.cause.kind is CauseKind.UNKNOWN and not view.cancelled)
        )
        released = view.phase in (Phase.QUEUED, Phase.RUNNING) and not (
            (body.get("spec", {}).get("runPolicy") or {}).get("suspend")
        )
        started = parse_time(body.get("status", {}).get("startTime"))
        # Released before this process watched it: a pod may have been preempted and recreated
        # by the training operator meanwhile (its watch saw everything since).
        recreating = released and in_place(body) and (started is None or started < self._born)
        podless = released and view.phase is Phase.QUEUED and not self._pods.get(oid)
        if podless:
            since = (
                started
                or self._released_at.get(oid)
                or parse_time(body.get("metadata", {}).get("creationTimestamp"))
            )
            due = (since if since is not None else self._clock()) + PODLESS_AFTER_SECONDS
            if self._clock() < due:
                podless = False  # the training operator is still creating its pods
                if view.job:
                    self._wake_at(f"look:{oid}", view.job, due)
        annotated = (body.get("metadata", {}).get("annotations") or {}).get(ANNOTATION_ENDED)
        now = time.monotonic()
        if (unexplained or recreating or podless) and not annotated and self._looked.get(oid, 0.0) <= now:
            # Once per process for an end or an in-place object; every few seconds while a
            # released object has no pod at all (the training operator may be failing to create them).
            again = podless and not recreating
            self._looked[oid] = now + LOOK_AGAIN_SECONDS if again else float("inf")
            if again and view.job:
                self._wake_at(f"look:{oid}", view.job, self._clock() + LOOK_AGAIN_SECONDS)
            if await self._look_for_evidence(oid, body, pods_too=unexplained):
                verdict = await self._classify_cached(oid, body)
        return verdict

    async def _classify_cached(self, oid: str, body: Body) -> Verdict:
        pods_by_key = self._pods.get(oid, {})
        retained, last_restart = self._retained.get(oid), self._last_restart.get(oid)
        key = (
            resource_version(body),
            tuple(sorted((k, resource_version(p)) for k, p in pods_by_key.items())),
            retained,
            last_restart,
        )
        known = self._verdicts.get(oid)
        if known is not None and known[0] == key:
            return known[1]
        pods = list(pods_by_key.values())
        lost: set[str] = set()
        uses_nodes = False
        for pod in pods:
            if needs_node(pod):
                uses_nodes = True
                node = pod.get("spec", {}).get("nodeName")
                if node and await self._node_lost(node):
                    lost.add(node)
        verdict = classify(
            body, pods, now=self._clock(), gone_nodes=lost, retained=retained, last_restart=last_restart
        )
        if verdict.recheck_at is None and not uses_nodes and None not in key[:1]:
            self._verdicts[oid] = (key, verdict)  # neither the clock nor a node lookup can change it
        else:
            self._verdicts.pop(oid, None)
        return verdict

    async def _look_for_evidence(self, oid: str, body: Body, *, pods_too: bool) -> bool:
        """Ask the API server why ``oid``'s pods ended, when the cache cannot say; True if found.

        First (``pods_too``) the pods by label, read now (the pod watch may lag the PyTorchJob watch
        that brought the end). Then the events Kubernetes wrote on them, which outlive the pods
        (an hour by default): the scheduler's ``Preempted``, the taint manager's
        ``TaintManagerEviction``, the kubelet's ``Evicted``, and the training operator's
        ``FailedCreatePod`` on the PyTorchJob (its pods can never be created). Only events from
        after the object was released count, so a reused name cannot inherit an old cause."""
        pj = body
        namespace, _ = split_id(oid, "object")
        found: list[Evidence] = []
        try:
            if pods_too:
                owner = owner_of(pj)
                if owner is not None:
                    selector = f"{LABEL_JOB}={owner[0].split('/', 1)[1]},{LABEL_SUBMISSION}={owner[1]}"
                    listing = await request(
                        self.api,
                        "GET",
                        f"/api/v1/namespaces/{namespace}/pods",
                        query={"labelSelector": selector},
                    )
                    for pod in listing.get("items") or []:
                        evidence, _ = pod_evidence(
                            pod,
                            restarts_in_place=in_place(pj),
                            now=self._clock(),
                            no_capacity_after_seconds=no_capacity_after(pj),
                        )
                        if evidence is not None and evidence.terminal:
                            found.append(evidence)
            if not found:
                events = await self._disruption_events(namespace)
                evidence = event_evidence(pj, events)
                if evidence is not None:
                    found.append(evidence)
        except BackendError as error:
            log.debug("look for the evidence of %s: %s", oid, error)
            self._looked.pop(oid, None)  # try again on the next list()
            return False
        kept = best([*found, *([self._retained[oid]] if oid in self._retained else [])])
        if kept is None or kept == self._retained.get(oid):
            return False
        log.info("%s: %s found on the API server (%s)", oid, kept.cause.kind, kept.cause.detail)
        self._retained[oid] = kept
        return True

    async def _disruption_events(self, namespace: str) -> builtins.list[Body]:
        """The namespace's events that say why a pod was disrupted, read at most every few seconds."""
        now = time.monotonic()
        known = self._events.get(namespace)
        if known is not None and known[0] > now:
            return known[1]
        items: builtins.list[Body] = []
        for kind, reason in EVIDENCE_EVENTS:
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
                log.debug("cannot tell whether node %s exists: %s", node, error)
            lost = error.status == 404
        self._nodes[node] = (lost, now + NODE_CACHE_SECONDS)
        return lost

    # ---- stopping what the scheduler would carry on ----------------------------------------------

    def _stop_view(self, oid: str, body: Body, verdict: Verdict, view: ObjectView) -> ObjectView:
        """The view of an object this process stops (or must stop): ended with the stop's cause."""
        stop = self._stops.get(oid)
        if stop is None:
            if not self.stop_ended:
                return view
            if verdict.stop is None:
                cause = view.cause
                if (
                    view.phase is Phase.ENDED
                    and cause is not None
                    and not view.cancelled
                    and stopped_body(body)
                    and self._unrecorded(body, cause)
                ):
                    # Finished by the training operator for a reason only the pods gave: write it
                    # down before they go, so a restarted adapter reads the same cause.
                    stop = self._register_stop(oid, body, cause, deferrable=False)
                    if stop is not None:
                        self._ensure_stop_task(stop)
                return view
            stop = self._register_stop(oid, body, verdict.stop)
            if stop is None:
                return view
        if view.phase is not Phase.ENDED or verdict.stop is not None:
            # Evidence seen once is final (a pod recreated before the stop lands does not revive
            # the object), and the view keeps the cause the annotation will say.
            view = view.model_copy(update={"phase": Phase.ENDED, "cause": stop.cause, "cancelled": False})
        self._ensure_stop_task(stop)
        return view

    def _register_stop(
        self, oid: str, body: Body, cause: Cause, *, deferrable: bool | None = None
    ) -> _Stop | None:
        known = self._stops.get(oid)
        if known is not None:
            return known
        owner = owner_of(body)
        if owner is None:
            return None
        if deferrable is None:
            failed_pod = any(
                p.get("status", {}).get("phase") == "Failed"
                and not p.get("metadata", {}).get("deletionTimestamp")
                for p in self._pods.get(oid, {}).values()
            )
            deferrable = failed_pod and not in_place(body)
        stop = _Stop(oid, owner[0], owner[1], cause, deferrable=deferrable)
        self._stops[oid] = stop
        return stop

    def _ensure_stop_task(self, stop: _Stop) -> None:
        if stop.landed or (stop.task is not None and not stop.task.done()):
            return
        stop.task = self._spawn(self._run_stop(stop), f"dispatch-kubeflow-stop-{stop.oid}")

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
                finished = stopped_body(body)
                if finished and not self._unrecorded(body, stop.cause):
                    break  # finished by the training operator, and it says what the pods said
                try:
                    # On a finished object only the cause is written: the pods that said it are
                    # deleted soon (a preempted pod about a second later), the PyTorchJob stays.
                    await self._patch_stop(stop.oid, stop.cause, suspend=not finished)
                    break
                except TransientBackendError as error:
                    delay = STOP_RETRY[min(failures, len(STOP_RETRY) - 1)]
                    failures += 1
                    log.warning("stop %s: %s; again in %.2fs", stop.oid, error, delay)
                    await asyncio.sleep(delay)
            stop.landed = True
        except asyncio.CancelledError:
            raise
        except Exception as error:
            log.warning("stop %s: %s", stop.oid, error)
            stop.error = error

    async def _await_stops(self, job: str) -> None:
        for stop in [s for s in self._stops.values() if s.job == job]:
            if stop.reported and not stop.deferrable and not stop.landed:
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
        finished, being deleted: :func:`stopped_body`), so a stale cache can only cause a redundant
        write, never a second released object. Objects this process has never seen (deleted before
        it started, or not yet in its watch) are looked up with one read.
        """
        namespace, job_name = split_id(job)
        seen: set[int] = set()
        candidates = self._ids_of(job) | {s.oid for s in self._stops.values() if s.job == job}
        for oid in sorted(candidates):
            body = self._current(oid)
            owner = owner_of(body) if body is not None else None
            if body is None or owner is None or oid == releasing:
                continue
            seen.add(owner[1])
            if owner[1] < submission and not stopped_body(body):
                await self._stop_now(oid, body, submission)
        missing = [
            k
            for k in range(1, submission)
            if k not in seen and f"{namespace}/{object_name(job_name, k)}" not in self._tombstones
        ]
        if not missing:
            return
        listing = await self._call_query(
            self._pj_path(namespace), {"labelSelector": f"{LABEL_JOB}={job_name},{SELECTOR}"}
        )
        for item in listing.get("items") or []:
            owner = owner_of(item)
            oid = key_of(item)
            if owner is None or owner[0] != job or owner[1] >= submission or oid == releasing:
                continue
            if not stopped_body(item):
                self._remember(oid, job, item)
                await self._stop_now(oid, item, submission)

    async def _stop_now(self, oid: str, body: Body, submission: int) -> None:
        stop = self._stops.get(oid)
        if stop is None:
            verdict = await self._classify(oid, body)
            cause = verdict.stop or Cause(
                kind=CauseKind.UNKNOWN,
                detail=f"stopped by dispatch before submission {submission} of the job was released",
            )
            stop = self._register_stop(oid, body, cause)
            if stop is None:
                return
        if stop.landed and not stopped_body(self._current(oid) or body):
            stop.landed = False  # it was gone from our cache, but the API server still has it
        log.info("release of submission %d waits for the stop of %s", submission, oid)
        await self._await_stop(stop, now=True)

    def _unrecorded(self, body: Body, cause: Cause) -> bool:
        """The API server does not keep ``cause`` on this finished object: no annotation, not being
        deleted, and the PyTorchJob alone (its conditions, without the pods) says something else."""
        meta = body.get("metadata", {})
        if (meta.get("annotations") or {}).get(ANNOTATION_ENDED) or meta.get("deletionTimestamp"):
            return False
        alone = classify(body, (), now=self._clock()).view.cause
        return alone is None or alone.kind is not cause.kind

    async def _patch_stop(self, oid: str, cause: Cause, *, suspend: bool = True) -> None:
        """One merge patch: the cause into ``dispatch.dev/ended`` and ``suspend: true`` (the training
        operator then deletes the pods and creates no more). No resourceVersion: it only ever moves
        the object towards stopped, so it cannot undo anyone's write that matters, and a status
        update by the training operator does not make it fail with 409. A release racing with it
        is conditional (resourceVersion) and refuses once the annotation is there."""
        namespace, name = split_id(oid, "object")
        patch: Body = {"metadata": {"annotations": {ANNOTATION_ENDED: ended_annotation(cause)}}}
        if suspend:
            patch["spec"] = {"runPolicy": {"suspend": True}}
        try:
            patched = await request(
                self.api, "PATCH", self._pj_path(namespace, name), body=patch, content_type=MERGE_PATCH
            )
        except KubeError as error:
            if error.status == 404:
                return
            raise self._explain(error, f"stop PyTorchJob {oid}") from None
        log.info("%s %s: %s (%s)", "stopped" if suspend else "recorded", oid, cause.kind, cause.detail)
        self._remember(oid, None, patched)
        if suspend:
            self._schedule_cleanup(oid)

    def _schedule_cleanup(self, oid: str) -> None:
        """The training operator deletes a suspended job's pods; if some still run after
        ``pod_cleanup_after`` (no training operator, or a stuck one), delete them ourselves."""
        key = f"cleanup:{oid}"
        if key in self._timers:
            return

        def fire() -> None:
            self._timers.pop(key, None)
            self._spawn(self._cleanup_pods(oid), f"dispatch-kubeflow-cleanup-{oid}")

        self._timers[key] = asyncio.get_running_loop().call_later(self.pod_cleanup_after, fire)

    async def _cleanup_pods(self, oid: str) -> None:
        alive = [
            p
            for p in self._pods.get(oid, {}).values()
            if not p.get("metadata", {}).get("deletionTimestamp")
            and p.get("status", {}).get("phase") in ("Running", "Pending")
        ]
        if not alive:
            return
        namespace, name = split_id(oid, "object")
        log.info("%d pod(s) of stopped %s still run: deleting them", len(alive), oid)
        try:
            await self._delete_pods(namespace, name, self._current(oid))
        except BackendError as error:
            log.warning("delete the pods of stopped %s: %s", oid, error)

    def _check_stop(self, oid: str) -> None:
        """From the watches: start a stop as soon as the evidence arrives, for the jobs someone in
        this process supervises (never for others: a standby operator writes nothing)."""
        if not self.stop_ended or not self._tasks:
            return
        body = self._current(oid)
        if body is None:
            return
        stop = self._stops.get(oid)
        if stop is not None:
            if stopped_body(body):
                stop.now.set()  # a deferred stop has nothing left to write
            return
        owner = owner_of(body)
        if owner is None or not self._subscribers.get(owner[0]):
            return
        if stopped_body(body) or oid in self._ended_by_us or oid in self._sweeping:
            return
        if self._verdict_now(oid, body).stop is None:
            return
        self._sweeping.add(oid)
        self._spawn(self._sweep(oid), f"dispatch-kubeflow-sweep-{oid}")

    async def _sweep(self, oid: str) -> None:
        try:
            body = self._current(oid)
            if body is None or oid in self._stops:
                return
            verdict = await self._classify(oid, body)
            if verdict.stop is not None and oid not in self._stops:
                stop = self._register_stop(oid, body, verdict.stop)
                if stop is not None:
                    self._ensure_stop_task(stop)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            log.debug("sweep %s: %s", oid, error)
        finally:
            self._sweeping.discard(oid)

    # ---- writes ------------------------------------------------------------------------------

    async def _let_go(self, namespace: str, name: str, body: Body | None) -> None:
        """Remove dispatch's finalizer (a JSON patch with a test, so no other finalizer is touched)."""
        for attempt in range(5):
            if body is None or attempt:
                body = await self._get_pj(namespace, name)
                if body is None:
                    return
            finalizers = list(body.get("metadata", {}).get("finalizers") or ())
            if OBJECT_FINALIZER not in finalizers:
                return
            at = f"/metadata/finalizers/{finalizers.index(OBJECT_FINALIZER)}"
            patch = [{"op": "test", "path": at, "value": OBJECT_FINALIZER}, {"op": "remove", "path": at}]
            try:
                patched = await request(
                    self.api, "PATCH", self._pj_path(namespace, name), body=patch, content_type=JSON_PATCH
                )
            except KubeError as error:
                if error.status == 404:
                    return
                if error.status in (409, 422):
                    continue  # the list changed since read: read again
                raise self._explain(error, f"remove the finalizer of PyTorchJob {namespace}/{name}") from None
            self._remember(f"{namespace}/{name}", None, patched)
            return
        raise TransientBackendError(
            f"remove the finalizer of PyTorchJob {namespace}/{name}: it kept changing"
        )

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
                raise self._explain(error, f"delete the pods of PyTorchJob {namespace}/{name}") from None

    async def _get_pj(self, namespace: str, name: str) -> Body | None:
        try:
            return await request(self.api, "GET", self._pj_path(namespace, name))
        except KubeError as error:
            if error.status == 404:
                return None
            raise self._explain(error, f"read PyTorchJob {namespace}/{name}") from None

    async def _call_query(self, path: str, query: Mapping[str, object]) -> Body:
        try:
            return await request(self.api, "GET", path, query=query)
        except KubeError as error:
            raise self._explain(error, f"list {path}") from None

    async def _call(self, method: str, path: str, *, what: str) -> Body:
        try:
            return await request(self.api, method, path)
        except KubeError as error:
            raise self._explain(error, f"{method} {what}") from None

    @staticmethod
    def _explain(error: KubeError, doing: str) -> BackendError:
        if error.status == 404:
            return BackendError(f"{doing}: not found ({error.message})")
        if error.status in (401, 403):
            return BackendError(f"{doing}: not allowed ({error.status} {error.reason}): {error.message}")
        if error.status == 422:
            return BackendError(f"{doing}: rejected as invalid: {error.message}")
        return BackendError(f"{doing}: {error.status} {error.reason}: {error.message}")

    @staticmethod
    def _pj_path(namespace: str | None, name: str | None = None) -> str:
        base = f"/apis/{KUBEFLOW_GROUP}/{KUBEFLOW_VERSION}"
        path = (
            f"{base}/namespaces/{namespace}/{PYTORCHJOB_PLURAL}"
            if namespace
            else f"{base}/{PYTORCHJOB_PLURAL}"
        )
        return f"{path}/{name}" if name else path

    # ---- for tests and benchmarks -------------------------------------------------------------

    def watch_events(self) -> int:
        """How many watch events the shared watches have delivered (not counting lists)."""
        return sum(i.events for i in self._informers)


async def open_adapter(config: Mapping[str, object] | None = None) -> KubeflowBackend:
    """Entry point ``dispatch.adapters: kubeflow``.

    Config: ``kubeconfig`` (path; default $KUBECONFIG, ~/.kube/config, else in-cluster),
    ``context``, ``namespaces`` (list; default all), ``stop_ended`` (default true).
    """
    from .._kubeapi import new_client

    config = dict(config or {})
    unknown = set(config) - {"kubeconfig", "context", "namespaces", "stop_ended"}
    if unknown:
        raise ValueError(f"kubeflow adapter: unknown config keys {sorted(unknown)}")
    kubeconfig = config.get("kubeconfig")
    context = config.get("context")
    namespaces = config.get("namespaces")
    if namespaces is not None and not (
        isinstance(namespaces, list | tuple) and all(isinstance(n, str) for n in namespaces)
    ):
        raise ValueError("kubeflow adapter: namespaces must be a list of namespace names")
    api = await new_client(
        str(kubeconfig) if kubeconfig is not None else None,
        context=str(context) if context is not None else None,
    )
    return KubeflowBackend(
        api,
        namespaces=list(namespaces) if namespaces is not None else None,
        stop_ended=flag("kubeflow", config, "stop_ended", True),  # "false" from YAML is false
        owns_api=True,
    )


__all__ = ["CAPABILITIES", "KubeflowBackend", "Phase", "open_adapter"]

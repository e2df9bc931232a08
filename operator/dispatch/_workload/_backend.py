"""The workload kit's backend: each submission of a job is one object of a :class:`Kind`.

Object ids are ``"<namespace>/<object name>"``; job ids are ``"<namespace>/<name>"``.

:class:`WorkloadBackend` is the :class:`~dispatch.Backend` face of parts that each hold one concern:
the cache of every object, pod and disruption Event (:mod:`._cache`, :mod:`._events`), fed by the
watches (:mod:`._watch`); the verdict on each object (:mod:`._verdicts`); the stop lane
(:mod:`._stop`); the release (:mod:`._release`) behind the fence (:mod:`._fence`); the requests on
the API server (:mod:`._requests`); and who is woken when (:mod:`._wakes`). :meth:`WorkloadBackend.list`
answers from the cache once it has synced, completed by what this process wrote itself (an object
it created is shown even before the watch brings it back).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Final

from .._constants import API_VERSION, KIND
from .._errors import ObjectExists
from .._kubeclient import Client, KubeError, request
from .._model import Capabilities, Cause, CauseKind, JobSpec, ObjectView, Phase, Plan
from .._protocols import Unsubscribe, Wake
from ._cache import Cache
from ._classify import Verdict, vanished
from ._fence import Fence
from ._fields import owner_of, restart_budget
from ._kind import Kind, Refused, Target
from ._kueue import hold_for_queue, workloads_for
from ._mask import Body
from ._release import Releaser
from ._requests import ObjectApi, OwnerLookup, dispatchjob_owner, explain, refused_for_good, split_id
from ._stop import Stopper
from ._tracked import kept_view
from ._verdicts import Verdicts
from ._wakes import Wakes
from ._watch import Watches

_DEFAULT_OWNER: Final[OwnerLookup] = dispatchjob_owner
_UID_SIZED: Final = "0" * 36
"""A placeholder as long as an object uid, so a preview weighs what the real object does."""


class WorkloadBackend:
    """A :class:`~dispatch.Backend` running each submission as one object of ``kind``.

    The kit's parts, each holding one concern, are its read-only attributes; a test or benchmark
    feeds and reads them directly (the backend keeps no names of its own for them):

    - :attr:`cache` (:class:`~._cache.Cache`): the tracked objects, their pods, tombstones and
      refused creates, what is kept of each body (``project``, ``packed``), and the disruption
      Events index (``cache.events``);
    - :attr:`watches` (:class:`~._watch.Watches`): the informers and their handlers
      (``object_changed``, ``pod_changed``); ``watches.tasks`` non-empty counts as started, so a
      task of one's own there makes a backend whose handlers are fed by hand;
    - :attr:`verdicts` (:class:`~._verdicts.Verdicts`): the verdict on each object (``cached``,
      ``classify``), Kueue's Workloads once watched, and when this process began watching (``born``);
    - :attr:`stopper` (:class:`~._stop.Stopper`): the stop lane (``patch``, ``cleanup_pods``);
    - :attr:`releaser` (:class:`~._release.Releaser`): the release behind the fence;
    - :attr:`objects` (:class:`~._requests.ObjectApi`): the reads and deletes on the API server;
    - :attr:`wakes` (:class:`~._wakes.Wakes`): the subscribers, timers and background tasks.
    """

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
        self._owner = owner
        self._owns_api = owns_api
        self._log = logging.getLogger(f"dispatch.{kind.name}")
        self._kueue_wanted = kueue
        self._unwatch_kueue: Callable[[], Awaitable[None]] | None = None
        self.wakes: Final[Wakes] = Wakes(clock)
        self.cache: Final[Cache] = Cache(kind, api, self.namespaces, self.wakes)
        self.objects: Final[ObjectApi] = ObjectApi(kind, api, self.cache.remember)
        self.verdicts: Final[Verdicts] = Verdicts(kind, api, self.cache, self.wakes, clock, self._log)
        self.stopper: Final[Stopper] = Stopper(
            kind,
            self.objects,
            self.cache,
            self.verdicts,
            self.wakes,
            enabled=stop_ended,
            grace=stop_grace,
            pod_cleanup_after=pod_cleanup_after,
            started=lambda: bool(self.watches.tasks),
            log=self._log,
        )
        fence = Fence(self.objects, self.cache, self.verdicts, self.stopper, self._log)
        self.releaser: Final[Releaser] = Releaser(kind, self.objects, self.cache, fence, clock, self._log)
        self.watches: Final[Watches] = Watches(
            kind,
            api,
            self.namespaces,
            self.cache,
            self.verdicts,
            self.stopper,
            self.wakes,
            sync_timeout=sync_timeout,
        )

    # ---- Backend protocol ------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.kind.name

    @property
    def capabilities(self) -> Capabilities:
        # Kueue can queue this backend's objects only once its Workloads are watched (prepare()).
        caps = self.kind.capabilities
        queues = self.verdicts.workloads is not None
        return caps if caps.queues is queues else caps.model_copy(update={"queues": queues})

    @property
    def wakes_itself(self) -> bool:
        """Every change its watches see wakes the job, and so do its own timers at the moments no
        event announces (a verdict's due time, a podless object's next look, a node to look up
        again): the operator's loop need not look at its jobs periodically
        (:class:`~dispatch._protocols.SelfWaking`)."""
        return True

    async def prepare(self) -> None:
        """Once, at open: watch Kueue's Workloads (shared by the kit backends of this API client)
        when Kueue can queue this kind and the API server serves them."""
        if self.verdicts.workloads is not None:
            return
        workloads = await workloads_for(
            self.kind, self.api, self.namespaces, wanted=self._kueue_wanted, log=self._log
        )
        if workloads is not None:
            self.verdicts.workloads = workloads
            self._unwatch_kueue = workloads.subscribe(self.kind.resource.kind, self._workload_changed)

    def _workload_changed(self, oid: str) -> None:
        """A Workload of one of our objects changed: its verdict may have (admitted, evicted)."""
        state = self.cache.tracked.get(oid)
        if state is None:
            return
        state.verdict = None
        self.stopper.check(oid)
        self.wakes.wake(state.job)

    def preview(self, job: str, spec: JobSpec, plan: Plan) -> Body:
        """The body :meth:`create` would send for submission 1 (with an owner reference of the
        size a real one has), built without a request; raises :class:`~._kind.Refused` as
        :meth:`create` would refuse it."""
        namespace, job_name = split_id(job)
        owner = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": job_name,
            "uid": _UID_SIZED,
            "controller": True,
        }
        return hold_for_queue(self.kind.build(Target(namespace, job_name, 1, owner), spec, plan), spec)

    async def create(self, job: str, submission: int, spec: JobSpec, plan: Plan) -> str:
        namespace, job_name = split_id(job)
        self.watches.start()
        owner = await self._owner(self.api, namespace, job_name) if self._owner is not None else None
        target = Target(namespace, job_name, submission, owner)
        oid = target.id
        try:
            body = hold_for_queue(self.kind.build(target, spec, plan), spec)
        except Refused as refused:
            return self._refuse(oid, job, submission, f"not created: {refused}")
        try:
            created = await request(self.api, "POST", self.objects.path(namespace), body=body)
        except KubeError as error:
            if error.status == 409:
                raise ObjectExists(oid) from None
            if refused_for_good(error):
                return self._refuse(oid, job, submission, f"the API server refused it: {error.message}")
            raise explain(error, f"create {self.objects.noun} {oid}") from None
        self.cache.remember(oid, job, created)
        return oid

    def _refuse(self, oid: str, job: str, submission: int, detail: str) -> str:
        """A submission that can never run: reported ended ``launch-failed`` under the name it would
        have had, so the job says why within the same reaction instead of retrying a create that will
        be refused again. In memory only: after a restart the canonical is missing, which the
        supervisor's decision treats as ended as well."""
        cause = Cause(kind=CauseKind.LAUNCH_FAILED, detail=detail[:1024])
        self._log.warning("%s %s %s", self.objects.noun, oid, detail)
        self.cache.refused[oid] = ObjectView(
            id=oid, job=job, submission=submission, phase=Phase.ENDED, cause=cause
        )
        self.wakes.wake(job)
        return oid

    async def release(self, object_id: str) -> None:
        await self.releaser.release(object_id)

    async def end(self, object_id: str, *, grace_seconds: int | None = None) -> None:
        namespace, name = split_id(object_id, "object")
        tracked = self.cache.tracked.get(object_id)
        stop = tracked.stop if tracked is not None else None
        if stop is not None and stop.task is not None and not stop.task.done():
            # Deleting supersedes a stop in flight (or waiting for the controller).
            stop.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await stop.task
        body = self.cache.current(object_id)
        owner = owner_of(body) if body is not None else None
        # Ours to let go of first: once deleted, this process no longer lists it as held by it.
        await self.objects.let_go(namespace, name, body)
        await self.objects.delete(namespace, name)
        if owner is not None:
            state = self.cache.state(object_id)
            state.ended_by_us = True
            self.cache.index(object_id, owner[0])
        if stop is not None:
            stop.landed = True  # deleted: nothing of it can run any more
        await self.objects.delete_pods(namespace, name, body, grace_seconds=grace_seconds)
        self.wakes.wake(owner[0] if owner is not None else None)

    async def confirm(self, job: str, object_id: str) -> Sequence[ObjectView]:
        """The watch cache lags writes made by another process (a second supervisor, the one before a
        restart): a canonical it does not show is looked up on the API server before it counts as
        gone, and kept as our own write until the watch brings it."""
        split_id(job)
        await self.watches.synced()
        if self.cache.current(object_id) is None and object_id not in self.cache.tombstones:
            namespace, name = split_id(object_id, "object")
            body = await self.objects.get(namespace, name)
            owner = owner_of(body) if body is not None else None
            if body is not None and owner is not None and owner[0] == job:
                self._log.info(
                    "job %s: canonical %s found on the API server before the watch showed it", job, object_id
                )
                self.cache.remember(object_id, job, body)
        return await self.list(job)

    async def list(self, job: str) -> Sequence[ObjectView]:
        split_id(job)
        await self.watches.synced()
        # A stop in flight is not waited for here: the object is shown ended at once, so that the
        # next submission is authorized and created while the stop lands; the release's fence and
        # quiesce() (before the job is recorded settled) are where it must have landed.
        views: list[ObjectView] = []
        for oid in sorted(self.cache.ids_of(job)):
            if oid in self.cache.tombstones:
                continue
            body = self.cache.current(oid)
            if body is None:
                continue
            verdict = await self.verdicts.classify(oid, body)
            view = self._view(oid, body, verdict)
            if verdict.recheck_at is not None:
                self.wakes.wake_at(f"recheck:{oid}", job, verdict.recheck_at)
            views.append(view)
        views.extend(v for v in self.cache.tombstones.values() if v.job == job)
        views.extend(v for v in self.cache.refused.values() if v.job == job)
        views = [self.verdicts.terminating(v) for v in views]
        views.sort(key=lambda v: (v.submission, v.id))
        return views

    def _view(self, oid: str, body: Body, verdict: Verdict) -> ObjectView:
        """The verdict's view with the most in-place restarts seen, and the stop's end; kept as the
        object's last view (its tombstone, once it is deleted)."""
        state = self.cache.state(oid)
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
        view = vanished(view) if state.ended_by_us else self.stopper.view(oid, body, verdict, view)
        state.last_view = kept_view(view)
        return view

    def subscribe(self, job: str, wake: Wake) -> Unsubscribe:
        unsubscribe = self.wakes.subscribe(job, wake)
        with contextlib.suppress(RuntimeError):  # no running loop: started by the first call
            self.watches.start()
        return unsubscribe

    def subscribe_others(self, wake: Callable[[str], None]) -> Unsubscribe:
        """Call ``wake(job)`` on a change of a job nobody subscribed to
        (:class:`~dispatch._protocols.Overseeing`)."""
        return self.wakes.others.subscribe(wake)

    def use_owner(self, owner: OwnerLookup | None) -> None:
        """Where the ownerReference of a job's objects comes from from now on (the operator's record
        store knows each DispatchJob's uid: no GET of the DispatchJob per create)."""
        self._owner = owner

    async def quiesce(self, job: str) -> None:
        """Before ``job`` is recorded settled (:class:`~dispatch._protocols.Quiescing`): every stop
        of its objects that their controller will not make itself has landed."""
        await self.stopper.quiesce(job)

    def stopped(self, body: Body) -> bool:
        """The API server says this object can run nothing any more, for good."""
        return self.stopper.stopped(body)

    def watch_events(self) -> int:
        """How many watch events the shared watches have delivered (not counting lists)."""
        return self.watches.count() + self.cache.events.count()

    async def aclose(self) -> None:
        tasks = [*self.watches.tasks, *self.wakes.background]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.watches.tasks.clear()
        self.wakes.background.clear()
        await asyncio.sleep(0)  # let the aborted watch connections finish closing
        self.wakes.close()
        if self._unwatch_kueue is not None:
            await self._unwatch_kueue()
            self._unwatch_kueue = self.verdicts.workloads = None
        if self._owns_api:
            await self.api.close()

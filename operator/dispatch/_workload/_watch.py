"""The watches that feed the cache: one list+watch per resource, shared by every job.

The kind's objects and the pods labelled ``app.kubernetes.io/managed-by=dispatch`` (and, through
the cache's :class:`~._events.EventIndex`, the disruption Events). The cache is fed only through
:meth:`Watches.object_changed` and :meth:`Watches.pod_changed`, which take packed projections, never
whole bodies; each change wakes the job it belongs to and, where the evidence says the object has
ended, starts its stop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from .._errors import TransientBackendError
from .._kubeclient import Client, Informer, KubeError, Packed, key_of
from .._model import CauseKind, StopKind
from ._cache import Cache
from ._classify import vanished
from ._evidence import best, kind_evidence, stopped_how
from ._fields import owner_of
from ._kept import POD
from ._kind import Kind, object_name
from ._mask import Body, reader
from ._requests import SELECTOR
from ._stop import Stopper
from ._verdicts import Verdicts
from ._wakes import Wakes


class Watches:
    """The informers of one backend, and what each of their changes does to the cache."""

    def __init__(
        self,
        kind: Kind,
        api: Client,
        namespaces: tuple[str, ...] | None,
        cache: Cache,
        verdicts: Verdicts,
        stopper: Stopper,
        wakes: Wakes,
        *,
        sync_timeout: float,
    ) -> None:
        self.kind = kind
        self.api = api
        self.namespaces = namespaces
        self.cache = cache
        self.verdicts = verdicts
        self.stopper = stopper
        self.wakes = wakes
        self.sync_timeout = sync_timeout
        self.informers: list[Informer[Packed]] = []
        self.tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        if self.tasks:
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
                    self.kind.resource.path(ns),
                    label_selector=SELECTOR,
                    on_change=self.object_changed,
                    on_relist=self.relisted,
                    project=self.cache.project,
                    pack=self.cache.pack_object,
                    read=reader(self.cache.mask),
                    what=f"{self.kind.resource.plural}{where}",
                )
            )
            pods.append(
                Informer(
                    self.api,
                    f"/api/v1/namespaces/{ns}/pods" if ns else "/api/v1/pods",
                    label_selector=SELECTOR,
                    on_change=self.pod_changed,
                    project=self.cache.project_pod,
                    pack=self.cache.pack_pod,
                    read=reader(POD),
                    what=f"pods{where}",
                )
            )
        self.informers = [*objects, *pods]
        events = self.cache.events.watches(scopes)
        name = self.kind.name
        self.tasks = [loop.create_task(i.run(), name=f"dispatch-{name}-{i.what}") for i in self.informers]
        self.tasks += [
            loop.create_task(self._watch_events(i, objects), name=f"dispatch-{name}-{i.what}") for i in events
        ]

    async def _watch_events(self, informer: Informer[Body], objects: Sequence[Informer[Packed]]) -> None:
        """The disruption Events, listed once the objects are: every Event about an object that
        exists then finds it tracked (the others wait in the index's ``early`` for their object)."""
        await asyncio.gather(*(i.synced.wait() for i in objects))
        await informer.run()

    async def synced(self) -> None:
        self.start()
        workloads = self.verdicts.workloads
        kueue = workloads.informers if workloads is not None else []
        every: tuple[Informer[Any], ...] = (*self.informers, *kueue)
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
                hint = f" (is the {self.kind.resource.kind} CRD {self.kind.resource} installed?)"
            raise TransientBackendError(
                f"the {self.kind.name} watches have not synced: {reasons}{hint}"
            ) from None

    def object_changed(self, old: Packed | None, new: Packed | None) -> None:
        # ``old`` and ``new`` are packed projections already (the informer projects and packs each
        # body as its event or list page arrives, the cache its own writes).
        packed = new if new is not None else old
        if packed is None:
            return
        body = packed.body()
        oid = key_of(body)
        owner = owner_of(body)
        job = owner[0] if owner is not None else None
        if new is None:
            self._object_gone(oid, job, body)
        else:
            state = self.cache.state(oid)
            state.body = new
            self.cache.index(oid, job)
            for pod in self.cache.early.pop(oid, ()):
                self._retain(oid, body, pod)
            self.cache.events.claim(oid, body)
            mine = state.overlay
            if mine is not None and (new.version or 0) >= (mine.version or 0):
                state.overlay = None
            self.stopper.check(oid)
        self.wakes.wake(job)

    def _object_gone(self, oid: str, job: str | None, body: Body) -> None:
        """Deleted from the API server: tombstoned with its last view (ended), then forgotten."""
        state = self.cache.tracked.get(oid)
        if state is not None:
            state.body = None
        if job is not None:
            self.cache.unindex(oid, job)
            last = state.last_view if state is not None else None
            if last is None:
                last = self.verdicts.now(oid, body).view
            self.cache.tombstone(vanished(last))
        self.cache.forget(oid)

    def relisted(self, rv: str) -> None:
        """Our own writes older than a fresh list and missing from it were deleted meanwhile."""
        try:
            listed = int(rv)
        except ValueError:
            return
        for state in list(self.cache.tracked.values()):
            mine = state.overlay
            if mine is not None and state.body is None and (mine.version or 0) <= listed:
                self.object_changed(mine, None)

    def pod_changed(self, old: Packed | None, new: Packed | None) -> None:
        # Packed projections, as for :meth:`object_changed`.
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
        current = self.cache.current(oid)
        self._stopped(oid, body)
        if new is None:
            tracked = self.cache.tracked.get(oid)
            if tracked is not None:
                tracked.pods.pop(pod_key, None)
            self.wakes.cancel(f"pod:{pod_key}")
            if current is not None:
                self._retain(oid, current, body)
            else:
                self.cache.keep_early(oid, body)
        else:
            self.cache.state(oid).pods[pod_key] = new
            if current is None:
                self.cache.keep_early(oid, body)
            else:
                self._retain(oid, current, body)
                _, at = kind_evidence(self.kind, current, body, now=self.verdicts.clock())
                if at is not None:
                    self.wakes.wake_at(f"pod:{pod_key}", job, at)
        if current is not None:
            self.stopper.check(oid)
        self.wakes.wake(job)

    def _stopped(self, oid: str, pod: Body) -> None:
        """A pod of an object dispatch deleted has terminated: its tombstone says how the stop went
        (forced once any pod was killed at its grace period's end)."""
        last = self.cache.tombstones.get(oid)
        how = stopped_how(pod) if last is not None and last.cancelled else None
        if last is None or how is None or last.stop is StopKind.FORCED or last.stop is how:
            return
        self.cache.tombstones[oid] = last.model_copy(update={"stop": how})

    def _retain(self, oid: str, body: Body, pod: Body) -> None:
        """Keep what a pod said about the end of its object, for when the pod is gone, and how often
        each incarnation of it was restarted in place (a recreated pod starts again from 0)."""
        state = self.cache.state(oid)
        restarted = False
        if self.kind.in_place(body):
            uid = pod.get("metadata", {}).get("uid") or key_of(pod)
            count = self.kind.restarts(pod)
            if count > state.incarnations.get(uid, 0):
                state.incarnations[uid] = count
                restarted = True
        found, _ = kind_evidence(self.kind, body, pod, now=self.verdicts.clock())
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

    def count(self) -> int:
        """How many watch events the object and pod watches have delivered (not counting lists)."""
        return sum(i.events for i in self.informers)

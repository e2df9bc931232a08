"""The kit's in-memory picture of its objects, shared by every job: one :class:`Tracked` per object.

It is fed by the watches (:mod:`._watch`) with projections, never whole bodies, and by this
process's own writes (:meth:`Cache.remember`), which it shows until the watch brings them (or
something newer) back: an object this process created is listed even before its watch event.
Tombstones keep the last view of an object deleted from the API server, so a job still reads how
it ended.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final

from .._kubeclient import Client, Packed, Packer, resource_version
from .._model import ObjectView
from ._events import EventIndex
from ._fields import owner_of
from ._kept import object_shape, project_object, project_pod
from ._kind import Kind
from ._mask import Body
from ._tracked import Tracked
from ._wakes import Wakes

MAX_TOMBSTONES: Final = 10_000


class Cache:
    """The tracked objects by id and by job, the tombstones, the pods seen before their object, the
    refused creates, and the disruption Events index (:attr:`events`). It keeps projections only:
    :meth:`project` and :meth:`project_pod` say what of a body it keeps, :meth:`packed` and
    :meth:`packed_pod` give a body as the watches hand it on."""

    def __init__(
        self,
        kind: Kind,
        api: Client,
        namespaces: tuple[str, ...] | None,
        wakes: Wakes,
    ) -> None:
        self.wakes = wakes
        self.mask = object_shape(kind)
        self.tracked: dict[str, Tracked] = {}
        self.pack_object = Packer()  # what the cache keeps of each object (and pod): Packed
        self.pack_pod = Packer()
        # job id -> ids of its tracked objects (a tuple: a job has a few, and a set of one is 216 bytes)
        self.by_job: dict[str, tuple[str, ...]] = {}
        self.tombstones: OrderedDict[str, ObjectView] = OrderedDict()
        self.refused: dict[str, ObjectView] = {}  # object id -> a create refused for good (never existed)
        self.early: OrderedDict[str, list[Body]] = OrderedDict()  # pods seen before their object
        self.events = EventIndex(kind, api, namespaces, self, wakes.wake)

    def project(self, body: Body) -> Body:
        """What the cache keeps of an object of this kind (see ``_kept.object_shape``)."""
        return project_object(self.mask, body)

    def project_pod(self, pod: Body) -> Body:
        """What the cache keeps of a pod (``_kept.POD``)."""
        return project_pod(pod)

    def packed(self, body: Body) -> Packed:
        """An object as the cache keeps it (its projection, packed), as its watch hands it on."""
        return self.pack_object(self.project(body))

    def packed_pod(self, pod: Body) -> Packed:
        """A pod as the cache keeps it (its projection, packed), as its watch hands it on."""
        return self.pack_pod(self.project_pod(pod))

    def state(self, oid: str) -> Tracked:
        state = self.tracked.get(oid)
        if state is None:
            state = self.tracked[oid] = Tracked()
        return state

    def index(self, oid: str, job: str | None) -> None:
        if job:
            self.state(oid).job = job
            ids = self.by_job.get(job, ())
            if oid not in ids:
                self.by_job[job] = (*ids, oid)

    def unindex(self, oid: str, job: str) -> None:
        ids = self.by_job.get(job)
        if ids is not None and oid in ids:
            left = tuple(i for i in ids if i != oid)
            if left:
                self.by_job[job] = left
            else:
                del self.by_job[job]

    def ids_of(self, job: str) -> set[str]:
        return set(self.by_job.get(job, ()))

    def job_of(self, oid: str) -> str | None:
        state = self.tracked.get(oid)
        return state.job if state is not None else None

    def current(self, oid: str) -> Body | None:
        """The object's projection, newest of the watch's and our own last write's (a copy)."""
        state = self.tracked.get(oid)
        packed = state.current() if state is not None else None
        return packed.body() if packed is not None else None

    def remember(self, oid: str, job: str | None, body: Body) -> None:
        """Our own write: newer than the cache until the watch brings it (or something newer) back."""
        body = self.project(body)
        state = self.state(oid)
        cached = state.body
        if cached is not None and (cached.version or 0) >= (resource_version(body) or 0):
            return  # nothing newer to keep: not packed
        state.overlay = self.pack_object(body)
        owner = owner_of(body)
        self.index(oid, job if job is not None else (owner[0] if owner is not None else None))
        self.tombstones.pop(oid, None)
        self.events.claim(oid, body)

    def tombstone(self, view: ObjectView) -> None:
        self.tombstones[view.id] = view
        self.tombstones.move_to_end(view.id)
        while len(self.tombstones) > MAX_TOMBSTONES:
            self.tombstones.popitem(last=False)

    def keep_early(self, oid: str, pod: Body) -> None:
        """The pod watch is ahead of the object watch: keep every word of the pod until its object
        arrives (a preempted pod is deleted about a second after it says why; the container's
        lastState is replaced once it is terminated)."""
        self.early.setdefault(oid, []).append(pod)
        self.early.move_to_end(oid)
        while len(self.early) > MAX_TOMBSTONES:
            self.early.popitem(last=False)

    def forget(self, oid: str) -> None:
        """The object is gone from the API server: keep only its pods that still run."""
        self.early.pop(oid, None)
        self.events.forget(oid)
        state = self.tracked.pop(oid, None)
        if state is None:
            return
        if state.pods:
            self.tracked[oid] = state.forgotten()
        stop = state.stop
        if stop is not None:
            stop.landed = True  # gone from the API server: nothing of it can run
            stop.now.set()
        for key in (f"recheck:{oid}", f"cleanup:{oid}"):
            self.wakes.cancel(key)

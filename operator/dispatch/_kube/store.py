"""The record store on the DispatchJob's status, with compare-and-swap by the API server.

The record of job ``"<namespace>/<name>"`` is the DispatchJob's ``.status`` (plus its spec, which
the object holds): :meth:`KubeRecordStore.get` reads the object and builds the record, its version
being ``metadata.resourceVersion``; :meth:`KubeRecordStore.put` is a PUT of ``/status`` carrying the
resourceVersion read, so a stale writer gets 409 (:class:`~dispatch.VersionConflict`) and decides
again. Nothing else writes the status: kopf's handlers return None. The operator is its only user,
so it lives here; how an object maps to a record, a refusal and conditions is
:mod:`dispatch._api`'s (shared with the webhook, the handlers and the kubectl plugin).

What the store keeps of a job is a :class:`JobView` (issue 13, "slim caches"): the metadata and
status fields the loop and the writes need, and the record parsed once per version and
:func:`compact`; the whole body only until then, or while there is no record to parse.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import sys
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, cast

from pydantic import BaseModel

from .._api import (
    OBSERVED_FIELDS,
    conditions_for,
    has_record,
    job_id,
    observed_fields,
    observed_of,
    record_from,
    record_status,
    refusal,
    refusal_conditions,
    render_conditions,
    utcnow,
)
from .._constants import API_VERSION, KIND
from .._errors import JobExists, JobNotFound, VersionConflict
from .._kubeclient import (
    Body,
    Client,
    Conflict,
    CustomObjects,
    NotFound,
    WatchEvent,
    resource_version,
    split_job,
    watch_forever,
)
from .._model import Actor, Cause, PlannedRule, QueuePlan, Record, RecoveryPolicy, Resources, Rule, State
from .._protocols import Unsubscribe, Versioned, Wake

log = logging.getLogger("dispatch.kubestore")

OnEvent = Callable[[str, str, Body], None]
"""Told about every DispatchJob event of the shared watch: (ADDED|MODIFIED|DELETED, job, body)."""


@dataclass(slots=True)
class JobView:
    """What the store keeps of one DispatchJob version: the few fields the loop and the writes need,
    and its record, parsed once (by the first :meth:`KubeRecordStore.get` of that version).

    The whole body is kept only until then, or while the job has no record (planning reads it);
    a version this store wrote itself keeps the record it wrote instead (nothing to parse).
    """

    version: str
    generation: int
    uid: str
    finalizers: tuple[str, ...]
    deleting: bool
    backend: str
    """``spec.backend``."""
    recorded: bool
    """The status holds a record (:func:`~dispatch._api.has_record`)."""
    refusal: str | None
    """The reason this generation was refused (:func:`~dispatch._api.refusal`), if it was."""
    observed_generation: int | None
    packed_conditions: tuple[tuple[tuple[str, ...], tuple[Any, ...]], ...]
    """``status.conditions``, each as (its keys, its values) with the strings interned: many jobs'
    conditions say the same words at the same second (see :meth:`conditions`)."""
    observed: dict[str, str]
    """The observed fields (:data:`OBSERVED_FIELDS`) as that version holds them."""
    body: Body | None
    """The whole body: until the record is parsed, and always while there is no record."""
    record: Record | None = None
    cancel_in_status: bool = False
    """The record's cancel request is in the status (not only in ``spec.cancel``)."""

    def conditions(self) -> list[dict[str, Any]]:
        """``status.conditions`` as that version holds them."""
        return [dict(zip(keys, values, strict=True)) for keys, values in self.packed_conditions]


def _pack(conditions: Sequence[Mapping[str, Any]]) -> tuple[tuple[tuple[str, ...], tuple[Any, ...]], ...]:
    def shared(value: Any) -> Any:
        return sys.intern(value) if type(value) is str else value

    return tuple(
        (_key_sets.setdefault(tuple(c), tuple(c)), tuple(shared(v) for v in c.values()))
        for c in conditions
        if isinstance(c, Mapping)
    )


_SHARED_MODELS: Final = (Actor, Cause, Rule, RecoveryPolicy, Resources, PlannedRule, QueuePlan)
"""Parts of a record that many records hold equal: one copy each (a Cause only without detail)."""
_models: weakref.WeakValueDictionary[int, BaseModel] = weakref.WeakValueDictionary()
_fields_sets: dict[tuple[type, frozenset[str]], set[str]] = {}
_enum_tuples: dict[tuple[enum.Enum, ...], tuple[enum.Enum, ...]] = {}
_key_sets: dict[tuple[str, ...], tuple[str, ...]] = {}


def compact(value: Any) -> Any:
    """``value`` (a record, or any part of it) holding one shared copy of what many records repeat.

    A parsed Record is about 18 KB as pydantic builds it, half of it one ``model_fields_set`` set per
    model instance; records share those sets (per model class and fields), their short strings
    (interned), their tuples of enum members, and the equal :data:`_SHARED_MODELS` (held weakly, so
    nothing outlives the records using it): about 6 KB. The models are frozen, so an equal part
    put in place of another changes nothing that any reader can see; a ``model_copy(update=...)``
    copies the set before it adds to it.

    Every record of a restart goes through here once, so the order is the cheap one: leaves
    (most of a record's values) leave first, and a shared model already known is taken before
    its parts are walked (its hash and equality read them anyway).
    """
    kind = type(value)
    if kind is str:
        return sys.intern(value) if len(value) <= 64 else value
    if kind in _LEAVES:
        return value
    if isinstance(value, BaseModel):
        shared = isinstance(value, _SHARED_MODELS) and not (isinstance(value, Cause) and value.detail)
        if shared:
            key = hash(value)
            known = _models.get(key)
            if known is not None and known == value:
                return known
        fields = value.__dict__
        for name, field in fields.items():
            part = compact(field)
            if part is not field:
                fields[name] = part
        set_ = value.__pydantic_fields_set__
        one = _fields_sets.setdefault((kind, frozenset(set_)), set_)
        if one is not set_:
            object.__setattr__(value, "__pydantic_fields_set__", one)
        if shared:
            _models[key] = value
        return value
    if kind is tuple and value:
        if all(isinstance(v, enum.Enum) for v in value):
            return _enum_tuples.setdefault(value, value)
        items = tuple(compact(v) for v in value)
        return items if any(a is not b for a, b in zip(items, value, strict=True)) else value
    return value


_LEAVES: Final = frozenset({int, float, bool, type(None), datetime})
"""Values :func:`compact` has nothing to share of (an enum member is one already)."""


def view_of(body: Body) -> JobView:
    """The projection of one DispatchJob body (see :class:`JobView`).

    The body it keeps has no ``metadata.managedFields`` (a third of a DispatchJob on the wire, and
    most of its small dicts: every view of a restart's first list holds its body until the job's
    first turn), unless ``spec.cancel`` is set: the cancel time is read from them
    (:func:`~dispatch._api.record_from`)."""
    meta = body.get("metadata") or {}
    status = body.get("status") or {}
    spec = body.get("spec") or {}
    if "managedFields" in meta and not spec.get("cancel"):
        meta = {k: v for k, v in meta.items() if k != "managedFields"}
        body = {**body, "metadata": meta}
    observed_generation = status.get("observedGeneration")
    return JobView(
        version=str(meta.get("resourceVersion", "")),
        generation=int(meta.get("generation") or 0),
        uid=str(meta.get("uid", "")),
        finalizers=tuple(meta.get("finalizers") or ()),
        deleting=bool(meta.get("deletionTimestamp")),
        backend=str(spec.get("backend", "")),
        recorded=has_record(body),
        refusal=refusal(body),
        observed_generation=None if observed_generation is None else int(observed_generation),
        packed_conditions=_pack(status.get("conditions") or ()),
        observed=observed_of(body),
        body=body,
    )


class KubeRecordStore:
    """Records in DispatchJobs' status; compare-and-swap by resourceVersion (PUT /status, 409).

    ``namespaces`` limits the shared watch behind :meth:`subscribe` (None: all namespaces).

    With ``cache`` (the default), :meth:`get` answers from the last version this store read or
    wrote for the job, for as long as the shared watch has shown no other version of it; any other
    version drops it (and wakes the job's subscribers, which read again). A record served that way
    can only be as stale as one read by a GET just before a concurrent write, which the
    compare-and-swap already handles: the next write fails with VersionConflict and the writer
    reads again. It saves the GET before every step on the hot path. What is kept of a version is
    its :class:`JobView`, never the whole body once the record is parsed.
    """

    def __init__(
        self,
        api: Client,
        *,
        namespaces: Sequence[str] | None = None,
        clock: Callable[[], datetime] = utcnow,
        cache: bool = True,
    ) -> None:
        self.api = api
        self.cache = cache
        self._views: dict[str, JobView] = {}
        """The last version of each job this store read, wrote or (for a cached job) was shown."""
        self._fresh: set[str] = set()
        """Jobs whose view is the newest the watch has shown: :meth:`get` may answer from it."""
        self.objects = CustomObjects(api)
        self.namespaces: tuple[str | None, ...] = tuple(namespaces) if namespaces else (None,)
        self.clock = clock
        self._subscribers: dict[str, list[Wake]] = {}
        self._watches: list[asyncio.Task[None]] = []
        self._listeners: list[OnEvent] = []
        self._observing: dict[str, dict[str, str]] = {}
        self._listed: set[str | None] = set()
        self._on_synced: list[Callable[[], None]] = []
        self.writes = 0
        self.conflicts = 0
        self.parses = 0
        """Records parsed from a body (once per version read; a version written is not parsed)."""

    # -- reading

    async def read(self, job: str) -> Body:
        """The DispatchJob of ``job`` as the API server has it now; raises JobNotFound."""
        namespace, name = split_job(job)
        try:
            body = await self.objects.get(namespace, name)
        except NotFound:
            raise JobNotFound(job) from None
        self._remember(job, view_of(body))
        return body

    async def get(self, job: str) -> Versioned:
        view = await self.view(job)
        return Versioned(self.record(job, view), view.version)

    async def view(self, job: str) -> JobView:
        """The job's last version from the cache the shared watch keeps, else from the API server."""
        cached = self.cache and (self._listeners or job in self._subscribers) and job in self._fresh
        view = self._views.get(job) if cached else None
        if view is None:
            await self.read(job)
            view = self._views[job]
        return view

    def record(self, job: str, view: JobView) -> Record:
        """The record of ``view``, parsed on the first call for that version; raises JobNotFound
        when it holds none."""
        if view.record is None:
            if not view.recorded or view.body is None:
                raise JobNotFound(job)
            view.record = cast(Record, compact(record_from(view.body, clock=self.clock)))
            view.cancel_in_status = "cancel" in (view.body.get("status") or {})
            view.body = None
            self.parses += 1
        return view.record

    async def owner_reference(self, api: object, namespace: str, name: str) -> Mapping[str, Any]:
        """The DispatchJob as the controlling ownerReference of its objects, from the uid the store
        keeps (a GET only for a job it does not know yet): the workload kit's owner lookup
        (``WorkloadBackend(owner=...)``), which otherwise reads the DispatchJob for every create."""
        job = job_id(namespace, name)
        view = self._views.get(job)
        uid = view.uid if view is not None else ""
        if not uid:
            uid = str((await self.read(job)).get("metadata", {}).get("uid") or "")
        if not uid:
            raise JobNotFound(job)
        return {"apiVersion": API_VERSION, "kind": KIND, "name": name, "uid": uid, "controller": True}

    def remember(self, job: str, body: Body) -> None:
        """A version of ``job`` this process wrote otherwise (the loop's finalizer patch), kept as if
        read: the next step finds it without a GET, and its write is not a 409 against it."""
        self._remember(job, view_of(body))

    # -- writing

    async def create(self, record: Record) -> str:
        """Write the first record into the DispatchJob's status (the object must exist)."""
        while True:
            body = await self.read(record.job)
            if has_record(body):
                raise JobExists(record.job)
            try:
                return await self.put(record, str(body["metadata"]["resourceVersion"]))
            except VersionConflict:
                continue

    async def put(self, record: Record, expected: str) -> str:
        status = record_status(record)
        seen = await self._seen_at(record.job, expected)
        status["observedGeneration"] = seen.generation
        status["conditions"] = render_conditions(
            conditions_for(record), seen.conditions(), seen.generation, self.clock()
        )
        # The PUT replaces the status: carry the observed fields over (or those of the decision that
        # made this write: :meth:`observing`), or set them when the record settles (nothing changes
        # after that, so the observer would only write them again).
        observing = self._observing.pop(record.job, None)
        if record.settled:
            status.update(observed_fields(record.state, record.cause))
        else:
            status.update(observing if observing is not None else seen.observed)
        # The status written holds the record (its cancel request too): the new version's record is
        # this one, so it is not parsed again.
        written = (cast(Record, compact(record)), record.cancel is not None)
        return await self._put_status(record.job, status, expected, written)

    def observed(self, job: str) -> dict[str, str]:
        """The observed fields of the last version of ``job`` this store read or wrote ({} if none)."""
        seen = self._views.get(job)
        return dict(seen.observed) if seen is not None else {}

    def observing(self, job: str, fields: dict[str, str]) -> None:
        """The observed fields the next :meth:`put` of ``job`` writes (what its decision shows)."""
        self._observing[job] = fields

    async def observe(
        self, job: str, state: State, cause: Cause, expected: str, note: str = ""
    ) -> str | None:
        """Write the observed fields when they differ from those of version ``expected``, else nothing.

        The record store's own compare-and-swap PUT of /status (a stale ``expected`` raises
        VersionConflict), remembered like a record write, so the next step reads it from the cache
        and its write does not conflict with this one. Returns the new version, None when unchanged.
        """
        fields = observed_fields(state, cause, note)
        seen = self._views.get(job)
        if seen is not None and seen.version == expected and seen.observed == fields:
            return None
        seen = await self._seen_at(job, expected)
        if seen.observed == fields:
            return None
        status = self._status_without_observed(job, seen)
        carried = (seen.record, seen.cancel_in_status) if seen.record is not None else None
        return await self._put_status(job, {**status, **fields}, expected, carried)

    def _status_without_observed(self, job: str, seen: JobView) -> dict[str, Any]:
        """The status of ``seen``'s version without the observed fields: from its body while it has
        one, else rebuilt from its record as :meth:`put` writes it (the status holds nothing else)."""
        if seen.body is not None:
            status = seen.body.get("status") or {}
            return {k: v for k, v in status.items() if k not in OBSERVED_FIELDS}
        record = self.record(job, seen)
        if not seen.cancel_in_status:  # a cancel request only in spec.cancel stays out of the status
            record = record.model_copy(update={"cancel": None})
        rebuilt = record_status(record)
        if seen.observed_generation is not None:
            rebuilt["observedGeneration"] = seen.observed_generation
        if seen.packed_conditions:
            rebuilt["conditions"] = seen.conditions()
        return rebuilt

    async def refuse(self, job: str, reason: str, message: str, expected: str) -> str:
        """Write a status without a record: the job is refused (Ready=False, Stalled=True, why)."""
        seen = await self._seen_at(job, expected)
        status = {
            "observedGeneration": seen.generation,
            "conditions": render_conditions(
                refusal_conditions(reason, message), seen.conditions(), seen.generation, self.clock()
            ),
        }
        return await self._put_status(job, status, expected)

    async def _seen_at(self, job: str, expected: str) -> JobView:
        seen = self._views.get(job)
        if seen is None or seen.version != expected:
            await self.read(job)
            seen = self._views[job]
            if seen.version != expected:
                self.conflicts += 1
                raise VersionConflict(job, expected, seen.version)
        return seen

    async def _put_status(
        self,
        job: str,
        status: dict[str, Any],
        expected: str,
        record: tuple[Record, bool] | None = None,
    ) -> str:
        """PUT ``status`` at ``expected``; ``record``: the written version's record (and whether
        its cancel request is in the status), when the caller knows it."""
        namespace, name = split_job(job)
        body = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": expected},
            "status": status,
        }
        try:
            written = await self.objects.replace_status(namespace, name, body)
        except Conflict:
            self.conflicts += 1
            self._views.pop(job, None)
            self._fresh.discard(job)
            raise VersionConflict(job, expected) from None
        except NotFound:
            raise JobNotFound(job) from None
        self.writes += 1
        view = view_of(written)
        cancelled = bool((written.get("spec") or {}).get("cancel"))
        if record is not None and view.recorded and (record[0].cancel is not None or not cancelled):
            view.record, view.cancel_in_status = record
            view.body = None
        self._remember(job, view)
        return view.version

    def _remember(self, job: str, view: JobView) -> None:
        self._views[job] = view
        if self.cache:
            self._fresh.add(job)

    # -- watching

    def subscribe(self, job: str, wake: Wake) -> Unsubscribe:
        """Call ``wake`` on every change of ``job``'s DispatchJob (one shared watch per namespace)."""
        self._subscribers.setdefault(job, []).append(wake)
        self._start_watches()

        def unsubscribe() -> None:
            wakes = self._subscribers.get(job)
            if wakes is not None and wake in wakes:
                wakes.remove(wake)
                if not wakes:
                    del self._subscribers[job]
                    if not self._listeners:
                        self._fresh.discard(job)
                        self._views.pop(job, None)

        return unsubscribe

    def watch_all(self, on_event: OnEvent, on_synced: Callable[[], None] | None = None) -> None:
        """Tell ``on_event`` about every DispatchJob event (the shared watch: list, then watch);
        ``on_synced()`` once the first list of every namespace has been told. From then on every
        body the watch shows is cached, so :meth:`get` needs no GET for any job."""
        self._listeners.append(on_event)
        if on_synced is not None:
            self._on_synced.append(on_synced)
        self._start_watches()

    def _start_watches(self) -> None:
        if self._watches:
            return
        loop = asyncio.get_running_loop()
        self._watches = [
            loop.create_task(self._watch(namespace), name=f"dispatch-store-watch-{namespace or 'all'}")
            for namespace in self.namespaces
        ]

    async def _watch(self, namespace: str | None) -> None:
        def listed() -> None:
            first = len(self._listed) < len(self.namespaces)
            self._listed.add(namespace)
            if first and len(self._listed) == len(self.namespaces):
                for synced in self._on_synced:
                    synced()

        async for event in watch_forever(self.objects, namespace, on_listed=listed):
            self._dispatch(event)

    def _dispatch(self, event: WatchEvent) -> None:
        meta = event.object.get("metadata") or {}
        if "name" not in meta or "namespace" not in meta:
            return
        job = job_id(meta["namespace"], meta["name"])
        if event.type == "DELETED":
            self._fresh.discard(job)
            self._views.pop(job, None)
        elif self.cache and (self._listeners or job in self._subscribers):
            # Keep the newest version: an event older than our own last write (the watch lags) is
            # not, and one of the version known (the echo of our own write, a relist) changes nothing.
            known = self._views.get(job) if job in self._fresh else None
            if known is None or (
                known.version != meta.get("resourceVersion")
                and (resource_version(event.object) or 0) >= (_revision(known.version) or 0)
            ):
                self._remember(job, view_of(event.object))
        elif job in self._fresh and self._views[job].version != meta.get("resourceVersion"):
            self._fresh.discard(job)
        for listener in tuple(self._listeners):
            try:
                listener(event.type, job, event.object)
            except Exception:  # a listener's bug must not stop the shared watch
                log.exception("event listener of job %s failed", job)
        for wake in tuple(self._subscribers.get(job, ())):
            try:
                wake()
            except Exception:  # a subscriber's bug must not stop the shared watch
                log.exception("wake callback of job %s failed", job)

    async def aclose(self) -> None:
        for task in self._watches:
            task.cancel()
        for task in self._watches:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._watches = []
        self._listed.clear()


def _revision(version: str) -> int | None:
    """A resourceVersion as a number, for ordering only (see :func:`resource_version`)."""
    return resource_version({"metadata": {"resourceVersion": version}})


__all__ = ["JobView", "KubeRecordStore", "view_of"]

"""The record store on the DispatchJob's status, with compare-and-swap by the API server.

The record of job ``"<namespace>/<name>"`` is the DispatchJob's ``.status`` (plus its spec, which
the object holds): :meth:`KubeRecordStore.get` reads the object and builds the record, its version
being ``metadata.resourceVersion``; :meth:`KubeRecordStore.put` is a PUT of ``/status`` carrying the
resourceVersion read, so a stale writer gets 409 (:class:`~dispatch.VersionConflict`) and decides
again. Nothing else writes the status: kopf's handlers return None. The operator is its only user,
so it lives here; how an object maps to a record, a refusal and conditions is
:mod:`dispatch._api`'s (shared with the webhook, the handlers and the kubectl plugin).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kubernetes_asyncio.client import ApiClient

from .._api import (
    OBSERVED_FIELDS,
    conditions_for,
    has_record,
    job_id,
    observed_fields,
    observed_of,
    record_from,
    record_status,
    refusal_conditions,
    render_conditions,
    utcnow,
)
from .._constants import API_VERSION, KIND
from .._errors import JobExists, JobNotFound, VersionConflict
from .._kubeclient import (
    Body,
    Conflict,
    CustomObjects,
    NotFound,
    WatchEvent,
    resource_version,
    split_job,
    watch_forever,
)
from .._model import Cause, Record, State
from .._protocols import Unsubscribe, Versioned, Wake

log = logging.getLogger("dispatch.kubestore")

OnEvent = Callable[[str, str, Body], None]
"""Told about every DispatchJob event of the shared watch: (ADDED|MODIFIED|DELETED, job, body)."""


@dataclass(frozen=True, slots=True)
class _Seen:
    version: str
    generation: int
    conditions: tuple[Mapping[str, Any], ...]
    observed: dict[str, str]
    """The observed fields (:data:`OBSERVED_FIELDS`) as that version holds them."""


class KubeRecordStore:
    """Records in DispatchJobs' status; compare-and-swap by resourceVersion (PUT /status, 409).

    ``namespaces`` limits the shared watch behind :meth:`subscribe` (None: all namespaces).

    With ``cache`` (the default), :meth:`get` answers from the last body this store read or wrote
    for the job, for as long as the shared watch has shown no other version of it; any other
    version drops it (and wakes the job's subscribers, which read again). A record served that way
    can only be as stale as one read by a GET just before a concurrent write, which the
    compare-and-swap already handles: the next write fails with VersionConflict and the writer
    reads again. It saves the GET before every step on the hot path.
    """

    def __init__(
        self,
        api: ApiClient,
        *,
        namespaces: Sequence[str] | None = None,
        clock: Callable[[], datetime] = utcnow,
        cache: bool = True,
    ) -> None:
        self.api = api
        self.cache = cache
        self._fresh: dict[str, Body] = {}
        self.objects = CustomObjects(api)
        self.namespaces: tuple[str | None, ...] = tuple(namespaces) if namespaces else (None,)
        self.clock = clock
        self._seen: dict[str, _Seen] = {}
        self._subscribers: dict[str, list[Wake]] = {}
        self._watches: list[asyncio.Task[None]] = []
        self._listeners: list[OnEvent] = []
        self._observing: dict[str, dict[str, str]] = {}
        self._listed: set[str | None] = set()
        self._on_synced: list[Callable[[], None]] = []
        self.writes = 0
        self.conflicts = 0

    # -- reading

    async def read(self, job: str) -> Body:
        """The DispatchJob of ``job`` as the API server has it now; raises JobNotFound."""
        namespace, name = split_job(job)
        try:
            body = await self.objects.get(namespace, name)
        except NotFound:
            raise JobNotFound(job) from None
        self._remember(job, body)
        if self.cache:
            self._fresh[job] = body
        return body

    async def get(self, job: str) -> Versioned:
        body = await self.body(job)
        return Versioned(record_from(body, clock=self.clock), str(body["metadata"]["resourceVersion"]))

    async def body(self, job: str) -> Body:
        """The job's DispatchJob from the cache the shared watch keeps, else from the API server."""
        cached = self._listeners or job in self._subscribers
        body = self._fresh.get(job) if self.cache and cached else None
        return body if body is not None else await self.read(job)

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
            conditions_for(record), seen.conditions, seen.generation, self.clock()
        )
        # The PUT replaces the status: carry the observed fields over (or those of the decision that
        # made this write: :meth:`observing`), or set them when the record settles (nothing changes
        # after that, so the observer would only write them again).
        observing = self._observing.pop(record.job, None)
        if record.settled:
            status.update(observed_fields(record.state, record.cause))
        else:
            status.update(observing if observing is not None else seen.observed)
        return await self._put_status(record.job, status, expected)

    def observed(self, job: str) -> dict[str, str]:
        """The observed fields of the last version of ``job`` this store read or wrote ({} if none)."""
        seen = self._seen.get(job)
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
        seen = self._seen.get(job)
        if seen is not None and seen.version == expected and seen.observed == fields:
            return None
        body = self._fresh.get(job)
        if body is None or str(body["metadata"]["resourceVersion"]) != expected:
            body = await self.read(job)
            if str(body["metadata"]["resourceVersion"]) != expected:
                self.conflicts += 1
                raise VersionConflict(job, expected, str(body["metadata"]["resourceVersion"]))
        status = {k: v for k, v in (body.get("status") or {}).items() if k not in OBSERVED_FIELDS}
        if observed_of(body) == fields:
            return None
        return await self._put_status(job, {**status, **fields}, expected)

    async def refuse(self, job: str, reason: str, message: str, expected: str) -> str:
        """Write a status without a record: the job is refused (Ready=False, Stalled=True, why)."""
        seen = await self._seen_at(job, expected)
        status = {
            "observedGeneration": seen.generation,
            "conditions": render_conditions(
                refusal_conditions(reason, message), seen.conditions, seen.generation, self.clock()
            ),
        }
        return await self._put_status(job, status, expected)

    async def _seen_at(self, job: str, expected: str) -> _Seen:
        seen = self._seen.get(job)
        if seen is None or seen.version != expected:
            await self.read(job)
            seen = self._seen[job]
            if seen.version != expected:
                self.conflicts += 1
                raise VersionConflict(job, expected, seen.version)
        return seen

    async def _put_status(self, job: str, status: dict[str, Any], expected: str) -> str:
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
            self._seen.pop(job, None)
            self._fresh.pop(job, None)
            raise VersionConflict(job, expected) from None
        except NotFound:
            raise JobNotFound(job) from None
        self.writes += 1
        self._remember(job, written)
        if self.cache:
            self._fresh[job] = written
        return str(written["metadata"]["resourceVersion"])

    def _remember(self, job: str, body: Body) -> None:
        meta = body.get("metadata", {})
        self._seen[job] = _Seen(
            version=str(meta.get("resourceVersion", "")),
            generation=int(meta.get("generation") or 0),
            conditions=tuple((body.get("status") or {}).get("conditions") or ()),
            observed=observed_of(body),
        )

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
                        self._fresh.pop(job, None)
                        self._seen.pop(job, None)

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
        fresh = self._fresh.get(job)
        if event.type == "DELETED":
            self._fresh.pop(job, None)
            self._seen.pop(job, None)
        elif self.cache and (self._listeners or job in self._subscribers):
            # Keep the newest body: an event older than our own last write (the watch lags) is not.
            if fresh is None or (resource_version(event.object) or 0) >= (resource_version(fresh) or 0):
                self._fresh[job] = event.object
                self._remember(job, event.object)
        elif fresh is not None and fresh["metadata"].get("resourceVersion") != meta.get("resourceVersion"):
            del self._fresh[job]
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


__all__ = ["KubeRecordStore"]

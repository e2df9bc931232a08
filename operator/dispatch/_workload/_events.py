"""The index of disruption Events by object: what Kubernetes recorded about pods that may be gone.

The Events watches (by field selector: the reasons :func:`~._evidence.evidence_events` names) keep
nothing themselves: each Event about an object the cache tracks goes into that object's index and
wakes its job, so an Event that arrives after the end it explains (the pod watch lagging, or pods
gone before this process saw them) is read without a poll. One about no object seen yet waits in
:attr:`EventIndex.early` until its object arrives; one the API server deleted (its TTL, an hour by
default) is dropped. Until the watches have listed, :meth:`EventIndex.disruption_events` reads a
namespace's Events with one LIST.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Final, Protocol

from .._constants import ANNOTATION_ENDED
from .._kubeclient import Client, Informer, key_of, request
from ._evidence import event_about, event_objects, evidence_events
from ._kept import project_event
from ._kind import Kind
from ._mask import Body
from ._requests import split_id

MAX_EARLY_EVENTS: Final = 2_000
"""Object names under which disruption Events about objects not (yet) tracked are kept."""
EVENTS_CACHE_SECONDS: Final = 2.0


class Objects(Protocol):
    """What the index reads of the cache: an object's projection and the job it belongs to."""

    def current(self, oid: str) -> Body | None: ...

    def job_of(self, oid: str) -> str | None: ...


class EventIndex:
    """The disruption Events of each tracked object (and of objects not seen yet), by object id."""

    def __init__(
        self,
        kind: Kind,
        api: Client,
        namespaces: tuple[str, ...] | None,
        objects: Objects,
        wake: Callable[[str | None], None],
    ) -> None:
        self.kind = kind
        self.api = api
        self.namespaces = namespaces
        self.objects = objects
        self.wake = wake
        self.evidence: dict[str, dict[str, Body]] = {}  # object id -> {event key: slim Event about it}
        self.early: OrderedDict[str, dict[str, Body]] = OrderedDict()  # the same, object not seen yet
        # scope -> its disruption Events watches
        self.informers: dict[str | None, list[Informer[Body]]] = {}
        self.recent: dict[str, tuple[float, list[Body]]] = {}  # namespace -> (until, disruption events)
        self.reading: dict[str, asyncio.Future[list[Body]]] = {}  # namespace -> the read in flight

    def watches(self, scopes: Sequence[str | None]) -> list[Informer[Body]]:
        """One watch per (kind, reason) of :func:`evidence_events` and namespace scope."""
        self.informers = {
            ns: [
                Informer(
                    self.api,
                    f"/api/v1/namespaces/{ns}/events" if ns else "/api/v1/events",
                    label_selector="",
                    field_selector=f"involvedObject.kind={kind},reason={reason}",
                    on_change=self.changed,
                    project=project_event,
                    store=False,
                    what=f"{kind} {reason} events{f' in {ns}' if ns else ''}",
                )
                for kind, reason in evidence_events(self.kind)
            ]
            for ns in scopes
        }
        return [i for informers in self.informers.values() for i in informers]

    def changed(self, old: Body | None, new: Body | None) -> None:
        """From the Events watches: index, keep for later, or drop one Event (see the module)."""
        event = new if new is not None else old
        if event is None:
            return
        namespace = event.get("metadata", {}).get("namespace", "")
        key = key_of(event)
        oids = [f"{namespace}/{name}" for name in event_objects(self.kind, event)]
        if new is None:
            for oid in oids:
                for kept in (self.evidence, self.early):
                    events = kept.get(oid)
                    if events is not None:
                        events.pop(key, None)
                        if not events:
                            del kept[oid]
            return
        placed = False
        for oid in oids:
            body = self.objects.current(oid)
            if body is not None and event_about(self.kind, body, new):
                placed = True
                self.index(oid, body, key, new)
        if placed:
            return
        for oid in oids:
            self.early.setdefault(oid, {})[key] = new
            self.early.move_to_end(oid)
        while len(self.early) > MAX_EARLY_EVENTS:
            self.early.popitem(last=False)

    def index(self, oid: str, body: Body, key: str, event: Body) -> None:
        if (body.get("metadata", {}).get("annotations") or {}).get(ANNOTATION_ENDED):
            return  # its cause is written on it: never looked for again
        events = self.evidence.setdefault(oid, {})
        if events.get(key) == event:
            return  # listed again
        events[key] = event
        self.wake(self.objects.job_of(oid))

    def claim(self, oid: str, body: Body) -> None:
        """``oid`` is tracked (again): the Events that arrived before it are its own now, and an
        object whose cause is written on it needs none."""
        early = self.early.pop(oid, None)
        if (body.get("metadata", {}).get("annotations") or {}).get(ANNOTATION_ENDED):
            self.evidence.pop(oid, None)
            return
        for key, event in (early or {}).items():
            if event_about(self.kind, body, event):
                self.index(oid, body, key, event)

    def forget(self, oid: str) -> None:
        self.evidence.pop(oid, None)
        self.early.pop(oid, None)

    def indexed(self, oid: str) -> list[Body] | None:
        """The disruption Events about ``oid`` from the watches' index, or None while those watches
        have not listed yet (or do not cover its namespace)."""
        namespace, _ = split_id(oid, "object")
        informers = self.informers.get(None if self.namespaces is None else namespace)
        if not informers or not all(i.synced.is_set() for i in informers):
            return None
        return list(self.evidence.get(oid, {}).values())

    async def disruption_events(self, namespace: str) -> list[Body]:
        """The namespace's events that say why a pod was disrupted, read at most every few seconds.

        One read per namespace at a time: after a mass preemption every worker looks for evidence
        at once, and each would otherwise parse the same large listing."""
        now = time.monotonic()
        known = self.recent.get(namespace)
        if known is not None and known[0] > now:
            return known[1]
        reading = self.reading.get(namespace)
        if reading is None:
            reading = asyncio.ensure_future(self._read(namespace, now))
            self.reading[namespace] = reading
            reading.add_done_callback(lambda _: self.reading.pop(namespace, None))
        return await asyncio.shield(reading)

    async def _read(self, namespace: str, now: float) -> list[Body]:
        items: list[Body] = []
        for kind, reason in evidence_events(self.kind):
            listing = await request(
                self.api,
                "GET",
                f"/api/v1/namespaces/{namespace}/events",
                query={"fieldSelector": f"involvedObject.kind={kind},reason={reason}"},
            )
            items.extend(listing.get("items") or [])
        self.recent[namespace] = (now + EVENTS_CACHE_SECONDS, items)
        return items

    def count(self) -> int:
        """How many watch events the Events watches have delivered (not counting lists)."""
        return sum(i.events for informers in self.informers.values() for i in informers)

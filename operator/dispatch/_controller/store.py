"""The record store on the DispatchJob's status, with compare-and-swap by the API server.

The record of job ``"<namespace>/<name>"`` is the DispatchJob's ``.status`` (plus its spec, which
the object holds): :meth:`KubeRecordStore.get` reads the object and builds the record, its version
being ``metadata.resourceVersion``; :meth:`KubeRecordStore.put` is a PUT of ``/status`` carrying the
resourceVersion read, so a stale writer gets 409 (:class:`~dispatch.VersionConflict`) and decides
again. Nothing else writes the status (kopf watches no DispatchJob). The operator is its only user,
so it lives here; how an object maps to a record, a refusal and conditions is
:mod:`dispatch._dispatchjob`'s (shared with the webhook, the runtime and the kubectl plugin). The
store calls it once per body it is shown (:func:`~dispatch._dispatchjob.read_status`, in
:func:`view_of`), once per record it parses (:func:`~dispatch._dispatchjob.record_from`) and once
per status it writes (:func:`~dispatch._dispatchjob.record_write`,
:func:`~dispatch._dispatchjob.refusal_write`); the codec calls nothing back.

What the store keeps of a job is a :class:`JobView`, small because it is kept for every job: the
metadata and status fields the loop and the writes need, and the part of the body its record is
read from, packed (its JSON text deflated: :class:`~dispatch._kubeclient.Packed`); the whole body
only while there is no record (planning reads it). A record is parsed from that when a turn needs
it, and the last few parsed are kept (:data:`PARSED`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

import msgspec

from .._constants import API_VERSION, KIND
from .._dispatchjob import (
    OBSERVED_FIELDS,
    has_record,
    job_id,
    observe_write,
    observed_fields,
    read_status,
    record_from,
    record_write,
    refusal_write,
    ttl_of,
    utcnow,
    with_asks,
)
from .._errors import JobExists, JobNotFound, VersionConflict
from .._kubeclient import (
    Body,
    Client,
    Conflict,
    CustomObjects,
    Informer,
    NotFound,
    Packed,
    Packer,
    resource_version,
    split_job,
)
from .._model import Cause, Cost, Record, State
from .._protocols import Unsubscribe, Versioned, Wake

log = logging.getLogger("dispatch.kubestore")

OnEvent = Callable[[str, Body | None], None]
"""Told about every DispatchJob event of the shared watch: (job, its body; None once deleted)."""


PARSED: Final = 64
"""Records kept parsed, the most recently used (as many as the loop's default workers): a turn
parses its job's record once and its steps find it; a parsed Record is about 18 KB, its packed
text under 200 bytes."""


@dataclass(slots=True)
class JobView:
    """What the store keeps of one DispatchJob version: the few fields the loop and the writes need,
    and, while it holds a record, the part of the body the record is read from, packed.

    The whole body is kept only while the job has no record (planning reads it).
    """

    version: str
    generation: int
    uid: str
    finalizers: tuple[str, ...]
    deleting: bool
    backend: str
    """``spec.backend``."""
    recorded: bool
    """The status holds a record (:func:`~dispatch._dispatchjob.has_record`)."""
    refusal: str | None
    """The reason this generation was refused (:func:`~dispatch._dispatchjob.refusal`), if it was."""
    observed_generation: int | None
    packed_conditions: tuple[tuple[tuple[str, ...], tuple[Any, ...]], ...]
    """``status.conditions``, each as (its keys, its values) with the strings interned: many jobs'
    conditions say the same words at the same second (see :meth:`conditions`)."""
    observed: dict[str, str]
    """The observed fields (:data:`OBSERVED_FIELDS`) as that version holds them."""
    body: Body | None
    """The whole body, while there is no record."""
    text: Packed | None = None
    """While there is a record: its metadata's name, namespace, labels and annotations, its spec,
    and its status without the conditions and the observed fields (held above), packed: about 1 KB
    of JSON in under 200 bytes, against about 2 KB for the record parsed and its parts shared, and
    one small block for the allocator."""
    cancelled_at: datetime | None = None
    """When ``spec.cancel`` was set (:func:`~dispatch._dispatchjob.cancel_time`, read once: without a
    managedFields entry it is the time this version was seen, and every parse must agree)."""
    settled_at: datetime | None = None
    """When the job settled, while it stays settled (:func:`~dispatch._dispatchjob.settled_status`):
    a settled job's turn is decided from the view, its record parsed only when something of it is
    to be ended or exported."""
    ttl: int | None = None
    """``spec.ttlSecondsAfterSettled``."""
    state: str = ""
    """``status.state``, the recorded state (interned)."""

    @property
    def slim(self) -> bool:
        """A settled job's view without its record's text, conditions and observed fields (see
        :func:`view_of`): a write, or a record, needs the object read whole."""
        return self.recorded and self.text is None

    def conditions(self) -> list[dict[str, Any]]:
        """``status.conditions`` as that version holds them."""
        return [dict(zip(keys, values, strict=True)) for keys, values in self.packed_conditions]

    def status_without_observed(self) -> dict[str, Any]:
        """The status of this version without the observed fields (what an observe write keeps)."""
        if self.text is None:
            status = (self.body or {}).get("status") or {}
            return {k: v for k, v in status.items() if k not in OBSERVED_FIELDS}
        status = dict(self.text.body()["status"])
        if self.packed_conditions:
            status["conditions"] = self.conditions()
        return status


def _pack(conditions: Sequence[Mapping[str, Any]]) -> tuple[tuple[tuple[str, ...], tuple[Any, ...]], ...]:
    def shared(value: Any) -> Any:
        return sys.intern(value) if type(value) is str else value

    return tuple(
        (_key_sets.setdefault(tuple(c), tuple(c)), tuple(shared(v) for v in c.values()))
        for c in conditions
        if isinstance(c, Mapping)
    )


_key_sets: dict[tuple[str, ...], tuple[str, ...]] = {}
_TOP: Final = ("apiVersion", "kind", "metadata", "spec", "status", "code", "reason", "message")
"""A DispatchJob's fields, and an ERROR event's Status's (code, reason, message; its status too)."""
_TEXT_METADATA: Final = ("name", "namespace", "labels", "annotations")
"""What :func:`~dispatch._dispatchjob.record_from` reads of the metadata (the cancel time aside)."""


_NOTHING_OBSERVED: Final[dict[str, str]] = {}
"""The observed fields of every slim view (never changed: a copy is what leaves the store)."""


def view_of(
    body: Body,
    clock: Callable[[], datetime] = utcnow,
    pack: Callable[[Body], Packed] = Packed,
    *,
    slim: bool = True,
) -> JobView:
    """The projection of one DispatchJob body (see :class:`JobView`).

    The body a view without a record keeps has no ``metadata.managedFields`` (a third of a
    DispatchJob on the wire, and most of its small dicts) unless ``spec.cancel`` is set: the cancel
    time is read from them (:func:`~dispatch._dispatchjob.record_from`).

    With ``slim``, a settled job's view keeps only what its turn reads (the metadata the finalizer
    needs, when it settled, its time to live and recorded state): most of a cluster's DispatchJobs
    are settled ones kept for their records, which the API server holds anyway. What a write or a
    record needs is read whole then (:meth:`KubeRecordStore.get`)."""
    meta = body.get("metadata") or {}
    status = body.get("status") or {}
    spec = body.get("spec") or {}
    observed_generation = status.get("observedGeneration")
    read = read_status(body, clock)  # the codec's one pass over the status
    recorded = read.recorded
    if slim and read.settled_at is not None:
        return JobView(
            version=str(meta.get("resourceVersion", "")),
            generation=int(meta.get("generation") or 0),
            uid="",  # a settled job creates nothing: no ownerReference is made from it
            finalizers=_shared(tuple(meta.get("finalizers") or ())),
            deleting=bool(meta.get("deletionTimestamp")),
            backend=sys.intern(str(spec.get("backend", ""))),
            recorded=True,
            refusal=None,
            observed_generation=None,
            packed_conditions=(),
            observed=_NOTHING_OBSERVED,
            body=None,
            settled_at=read.settled_at,
            ttl=ttl_of(spec),
            state=sys.intern(str(status.get("state", ""))),
        )
    text: Packed | None = None
    if recorded:
        kept = {
            "metadata": {k: meta[k] for k in _TEXT_METADATA if k in meta},
            "spec": spec,
            "status": {k: v for k, v in status.items() if k != "conditions" and k not in OBSERVED_FIELDS},
        }
        text = pack(kept)
    elif "managedFields" in meta and not spec.get("cancel"):
        meta = {k: v for k, v in meta.items() if k != "managedFields"}
        body = {**body, "metadata": meta}
    return JobView(
        version=str(meta.get("resourceVersion", "")),
        generation=int(meta.get("generation") or 0),
        uid=str(meta.get("uid", "")),
        finalizers=tuple(meta.get("finalizers") or ()),
        deleting=bool(meta.get("deletionTimestamp")),
        backend=sys.intern(str(spec.get("backend", ""))),
        recorded=recorded,
        refusal=read.refusal,
        observed_generation=None if observed_generation is None else int(observed_generation),
        packed_conditions=_pack(status.get("conditions") or ()),
        observed={k: sys.intern(v) for k, v in read.observed.items()},  # a few words, every job
        body=None if recorded else body,
        text=text,
        cancelled_at=read.cancelled_at,
        settled_at=read.settled_at,
        ttl=ttl_of(spec),
        state=sys.intern(str(status.get("state", ""))),
    )


_finalizer_sets: dict[tuple[str, ...], tuple[str, ...]] = {}


def _shared(finalizers: tuple[str, ...]) -> tuple[str, ...]:
    """One tuple for every view with the same finalizers (nearly every job has just dispatch's)."""
    if len(_finalizer_sets) > 64:  # many distinct sets: not worth sharing
        return finalizers
    return _finalizer_sets.setdefault(finalizers, finalizers)


_META: Final = (
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
)
"""Every field of an ObjectMeta but ``managedFields``."""
_Meta = msgspec.defstruct(
    "_Meta", [*((k, Any, msgspec.UNSET) for k in _META), ("managedFields", msgspec.Raw, msgspec.UNSET)]
)
_Object = msgspec.defstruct(
    "_Object",
    [(k, _Meta if k == "metadata" else Any, msgspec.UNSET) for k in _TOP],
)
_EventOrPage = msgspec.defstruct(
    "_EventOrPage",
    [
        ("type", Any, msgspec.UNSET),
        ("object", _Object, msgspec.UNSET),
        ("metadata", Any, msgspec.UNSET),
        ("items", list[_Object], msgspec.UNSET),  # type: ignore[valid-type]
    ],
)
_decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(_EventOrPage)


def read_dispatchjobs(raw: bytes) -> Body:
    """One DispatchJob watch event or list page, each DispatchJob without ``metadata.managedFields``
    unless ``spec.cancel`` is set (the cancel time is read from them:
    :func:`~dispatch._dispatchjob.cancel_time`).

    They are about 40 % of a DispatchJob's JSON and most of its small dicts; nothing else reads
    them, and a restart decodes every DispatchJob. JSON of another shape (a DispatchJob's
    metadata not an object) is decoded whole."""
    try:
        decoded = _decoder.decode(raw)
    except msgspec.ValidationError:
        whole: Body = json.loads(raw)
        return whole
    out: Body = {}
    if decoded.type is not msgspec.UNSET:
        out["type"] = decoded.type
    if decoded.object is not msgspec.UNSET:
        out["object"] = _body(decoded.object)
    if decoded.metadata is not msgspec.UNSET:
        out["metadata"] = decoded.metadata
    if decoded.items is not msgspec.UNSET:
        out["items"] = [_body(item) for item in decoded.items]
    return out


def _body(obj: Any) -> Body:
    body: Body = {k: v for k in _TOP if (v := getattr(obj, k)) is not msgspec.UNSET and k != "metadata"}
    meta = obj.metadata
    if meta is msgspec.UNSET:
        return body
    kept = {k: v for k in _META if (v := getattr(meta, k)) is not msgspec.UNSET}
    spec = body.get("spec")
    if meta.managedFields is not msgspec.UNSET and isinstance(spec, dict) and spec.get("cancel"):
        kept["managedFields"] = json.loads(bytes(meta.managedFields))
    body["metadata"] = kept
    return body


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
        self._pack = Packer()  # every job's record part packed against the first one's
        self._parsed: OrderedDict[str, tuple[str, Record]] = OrderedDict()
        """Job -> (version, its record): the last :data:`PARSED` records parsed or written."""
        self.objects = CustomObjects(api)
        self.namespaces: tuple[str | None, ...] = tuple(namespaces) if namespaces else (None,)
        self.clock = clock
        self._subscribers: dict[str, list[Wake]] = {}
        self._watches: list[asyncio.Task[None]] = []
        self._listeners: list[OnEvent] = []
        self._listed: set[str | None] = set()
        self._on_synced: list[Callable[[], None]] = []
        self.writes = 0
        self.conflicts = 0
        self.parses = 0
        """Records parsed from a view's text (a version written is not parsed)."""

    # -- reading

    async def read(self, job: str) -> Body:
        """The DispatchJob of ``job`` as the API server has it now; raises JobNotFound."""
        namespace, name = split_job(job)
        try:
            body = await self.objects.get(namespace, name)
        except NotFound:
            raise JobNotFound(job) from None
        self._remember(job, self._view_of(body, slim=False))  # read for a record or a write
        return body

    async def get(self, job: str) -> Versioned:
        view = await self.view(job)
        if view.slim and not self._is_parsed(job, view):
            await self.read(job)  # a settled job's record: read whole (the view keeps none)
            view = self._views[job]
        return Versioned(self.record(job, view), view.version)

    def _is_parsed(self, job: str, view: JobView) -> bool:
        parsed = self._parsed.get(job)
        return parsed is not None and parsed[0] == view.version

    async def view(self, job: str) -> JobView:
        """The job's last version from the cache the shared watch keeps, else from the API server."""
        cached = self.cache and (self._listeners or job in self._subscribers) and job in self._fresh
        view = self._views.get(job) if cached else None
        if view is None:
            await self.read(job)
            view = self._views[job]
        return view

    def knows(self, job: str) -> bool:
        """True when the shared watch has shown ``job`` (its view is in the cache: no request)."""
        return bool(self.cache and self._listeners) and job in self._fresh  # _fresh: jobs with a view

    def record(self, job: str, view: JobView) -> Record:
        """The record of ``view``: the one parsed or written last for that version, else parsed from
        the view's text; raises JobNotFound when it holds none."""
        parsed = self._parsed.get(job)
        if parsed is not None and parsed[0] == view.version:
            self._parsed.move_to_end(job)
            return parsed[1]
        if view.text is None:
            raise JobNotFound(job)
        at = view.cancelled_at
        record = record_from(view.text.body(), clock=self.clock if at is None else lambda: at)
        self.parses += 1
        self._keep_parsed(job, view.version, record)
        return record

    def _keep_parsed(self, job: str, version: str, record: Record) -> None:
        self._parsed[job] = (version, record)
        self._parsed.move_to_end(job)
        while len(self._parsed) > PARSED:
            self._parsed.popitem(last=False)

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

    async def set_finalizers(self, job: str, finalizers: list[str], expected: str) -> None:
        """Set ``metadata.finalizers`` if the object is still at ``expected`` (else VersionConflict):
        a merge patch carrying the resourceVersion read. The version written is kept as if read: the
        next step finds it without a GET, and its write is not a 409 against it."""
        namespace, name = split_job(job)
        patch = {"metadata": {"resourceVersion": expected, "finalizers": finalizers}}
        try:
            written = await self.objects.merge_patch(namespace, name, patch)
        except Conflict:
            raise VersionConflict(job, expected) from None
        except NotFound:
            raise JobNotFound(job) from None
        self._remember(job, self._view_of(written))

    # -- writing

    async def delete(self, job: str, expected: str) -> None:
        """Delete the DispatchJob if it is still at version ``expected`` (else VersionConflict): what
        was decided on that version (its time to live passed) holds for no other. Gone already: done."""
        namespace, name = split_job(job)
        try:
            await self.objects.delete(namespace, name, resource_version=expected)
        except Conflict:
            raise VersionConflict(job, expected) from None

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

    async def put(
        self,
        record: Record,
        expected: str,
        observed: Mapping[str, str] | None = None,
        cost: Cost | None = None,
    ) -> str:
        """Write ``record`` at version ``expected`` (VersionConflict when stale).

        The PUT replaces the status, so it carries the observed fields: ``observed`` (what the
        decision that made this write shows), else those of version ``expected``; and what recovery
        cost: ``cost``, else what ``record`` alone says."""
        seen = await self._seen_at(record.job, expected)
        status = record_write(
            record,
            previous=seen.conditions(),
            generation=seen.generation,
            now=self.clock(),
            observed=observed if observed is not None else seen.observed,
            cost=cost,
        )
        # The status written holds the record (its cancel request too): the new version's record is
        # this one, so it is not parsed again.
        return await self._put_status(record.job, status, expected, record)

    def observed(self, job: str) -> dict[str, str]:
        """The observed fields of the last version of ``job`` this store read or wrote ({} if none)."""
        seen = self._views.get(job)
        return dict(seen.observed) if seen is not None else {}

    async def observe(
        self, job: str, state: State, cause: Cause, expected: str, note: str = "", cost: Cost | None = None
    ) -> str | None:
        """Write the observed fields when they differ from those of version ``expected``, else nothing.

        ``cost`` (what recovery cost, with the live objects) goes with them: it changes only when
        they do (a failure is a record write; the next submission running shows ``running``).

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
        parsed = self._parsed.get(job)
        carried = parsed[1] if parsed is not None and parsed[0] == seen.version else None
        record = carried if carried is not None else self.record(job, seen)
        status = observe_write(
            record,
            seen.status_without_observed(),
            fields,
            previous=seen.conditions(),
            generation=seen.generation,
            now=self.clock(),
            cost=cost,
        )
        return await self._put_status(job, status, expected, record)

    async def refuse(self, job: str, reason: str, message: str, expected: str) -> str:
        """Write a status without a record: the job is refused (Ready=False, Stalled=True, why)."""
        seen = await self._seen_at(job, expected)
        status = refusal_write(
            reason, message, previous=seen.conditions(), generation=seen.generation, now=self.clock()
        )
        return await self._put_status(job, status, expected)

    async def _seen_at(self, job: str, expected: str) -> JobView:
        seen = self._views.get(job)
        if seen is None or seen.version != expected or seen.slim:
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
        record: Record | None = None,
    ) -> str:
        """PUT ``status`` at ``expected``; ``record``: the written version's record, when the caller
        knows it."""
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
            self._forget(job)
            raise VersionConflict(job, expected) from None
        except NotFound:
            raise JobNotFound(job) from None
        self.writes += 1
        view = self._view_of(written)
        cancelled = bool((written.get("spec") or {}).get("cancel"))
        # A person's ask the written record does not hold yet is read from the spec by the next parse.
        asks = record is not None and with_asks(record, written, self.clock) is not record
        if record is not None and view.recorded and (record.cancel is not None or not cancelled) and not asks:
            self._keep_parsed(job, view.version, record)
        self._remember(job, view)
        return view.version

    def _view_of(self, body: Body, *, slim: bool = True) -> JobView:
        """:func:`view_of` with this store's clock and packer (every job's record part packed
        against the first one's)."""
        return view_of(body, self.clock, self._pack, slim=slim)

    def _remember(self, job: str, view: JobView) -> None:
        self._views[job] = view
        if self.cache:
            self._fresh.add(job)

    def _forget(self, job: str) -> None:
        self._views.pop(job, None)
        self._fresh.discard(job)
        self._parsed.pop(job, None)

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
                        self._forget(job)

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
        """The namespace's DispatchJobs by the kit's :class:`Informer`, keeping nothing itself (the
        store keeps its views): a streamed list, or pages where the API server refuses one, then
        the watch, listed again on 410 and after a break."""
        listing: set[str] | None = None
        """The jobs a (re-)list has shown so far; None while watching."""

        def begin() -> None:
            nonlocal listing
            listing = set()

        def changed(old: Body | None, new: Body | None) -> None:
            body = new if new is not None else old  # the Informer keeps nothing: one is never None
            if body is None:
                return
            job = self._dispatch(body, deleted=new is None)
            if listing is not None and job is not None and new is not None:
                listing.add(job)

        def listed(_version: str) -> None:
            nonlocal listing
            seen, listing = listing, None
            if seen is not None and namespace in self._listed:
                # A re-list (the watch's resourceVersion expired, or it broke): what was deleted
                # meanwhile sent no DELETED, and would otherwise stay cached and supervised.
                prefix = f"{namespace}/" if namespace else ""
                for job in [j for j in self._views if j.startswith(prefix) and j not in seen]:
                    ns, name = split_job(job)
                    self._dispatch({"metadata": {"namespace": ns, "name": name}}, deleted=True)
            first = len(self._listed) < len(self.namespaces)
            self._listed.add(namespace)
            if first and len(self._listed) == len(self.namespaces):
                for synced in self._on_synced:
                    synced()

        informer: Informer[Body] = Informer(
            self.api,
            self.objects.path(namespace),
            on_change=changed,
            on_listing=begin,
            on_relist=listed,
            read=read_dispatchjobs,
            store=False,
            what=f"dispatchjobs in {namespace}" if namespace else "dispatchjobs",
        )
        await informer.run()

    def _dispatch(self, body: Body, *, deleted: bool = False) -> str | None:
        """Cache the job's body (forget it when ``deleted``) and tell the listeners and subscribers;
        the job it is about."""
        meta = body.get("metadata") or {}
        if "name" not in meta or "namespace" not in meta:
            return None
        job = job_id(meta["namespace"], meta["name"])
        if deleted:
            self._forget(job)
        elif self.cache and (self._listeners or job in self._subscribers):
            # Keep the newest version: an event older than our own last write (the watch lags) is
            # not, and one of the version known (the echo of our own write, a relist) changes nothing.
            known = self._views.get(job) if job in self._fresh else None
            if known is None or (
                known.version != meta.get("resourceVersion")
                and (resource_version(body) or 0) >= (_revision(known.version) or 0)
            ):
                self._remember(job, self._view_of(body))
        elif job in self._fresh and self._views[job].version != meta.get("resourceVersion"):
            self._fresh.discard(job)
        for listener in tuple(self._listeners):
            try:
                listener(job, None if deleted else body)
            except Exception:  # a listener's bug must not stop the shared watch
                log.exception("event listener of job %s failed", job)
        for wake in tuple(self._subscribers.get(job, ())):
            try:
                wake()
            except Exception:  # a subscriber's bug must not stop the shared watch
                log.exception("wake callback of job %s failed", job)
        return job

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

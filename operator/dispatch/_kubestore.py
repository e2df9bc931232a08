"""The record store on the DispatchJob's status, with compare-and-swap by the API server.

The record of job ``"<namespace>/<name>"`` is the DispatchJob's ``.status`` (plus its spec, which
the object holds): :meth:`KubeRecordStore.get` reads the object and builds the record, its version
being ``metadata.resourceVersion``; :meth:`KubeRecordStore.put` is a PUT of ``/status`` carrying the
resourceVersion read, so a stale writer gets 409 (:class:`~dispatch.VersionConflict`) and decides
again. Nothing else writes the status: kopf's handlers return None.

The status also carries kstatus conditions computed from the record (:func:`conditions_for`), so
GitOps tools and ``kubectl wait --for=condition=Succeeded`` understand it:

* ``Ready``: the summary, always present, reason always set. True only once the job has succeeded
  and settled.
* ``Reconciling`` (present only while true): the job has no outcome yet, or has one but objects
  are still being ended.
* ``Stalled`` (present only while true): the job can make no more progress without a person: it
  failed, was cancelled, or was refused (a rule nobody can enforce, an invalid spec).
* ``Succeeded`` / ``Failed``: the outcome. A cancelled job is ``Failed=True`` with reason
  ``Cancelled``, so ``kubectl wait --for=condition=Failed`` sees every unsuccessful end and the
  reason tells them apart. Both are present (False) while the job runs.

A cancel is ``spec.cancel: true`` (the one mutable spec field); the store turns it into the record's
cancel request with the actor from the annotation ``dispatch.dev/cancelled-by`` (set by the mutating
webhook) or else ``human:unknown``. Once written, the request is kept in the status.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from kubernetes_asyncio.client import ApiClient

from ._constants import (
    ANNOTATION_CANCELLED_BY,
    ANNOTATION_SUBMITTED_BY,
    API_VERSION,
    COND_FAILED,
    COND_READY,
    COND_RECONCILING,
    COND_STALLED,
    COND_SUCCEEDED,
    KIND,
    REASON_CANCELLED,
    REASON_FAILED,
    REASON_PENDING,
    REASON_RECOVERING,
    REASON_SUCCEEDED,
    STATUS_OBSERVED_CAUSE,
    STATUS_OBSERVED_STATE,
)
from ._errors import JobExists, JobNotFound, VersionConflict
from ._kubeapi import Body, Conflict, CustomObjects, NotFound, WatchEvent, job_id, split_job, watch_forever
from ._model import Actor, ActorKind, CancelRequest, Cause, CauseKind, Enforcer, JobSpec, Plan, Record, State
from ._protocols import Unsubscribe, Versioned, Wake

log = logging.getLogger("dispatch.kubestore")

UNKNOWN_HUMAN: Final = Actor(kind=ActorKind.HUMAN, id="unknown")
SPEC_EXTRAS: Final = ("backend", "cancel")
"""Spec fields of the DispatchJob that are not fields of the core's JobSpec."""
RECORD_FIELDS: Final = tuple(
    info.alias or name for name, info in Record.model_fields.items() if name not in ("job", "spec")
)


def utcnow() -> datetime:
    return datetime.now(UTC)


# ---- object <-> record -----------------------------------------------------------------------------


def job_spec(body: Mapping[str, Any]) -> JobSpec:
    """The core's JobSpec of a DispatchJob: its spec without backend and cancel, named metadata.name.

    Raises pydantic's ValidationError (a ValueError naming the field) when the spec is not valid.
    """
    spec = {k: v for k, v in (body.get("spec") or {}).items() if k not in SPEC_EXTRAS}
    return JobSpec.model_validate({**spec, "name": body["metadata"]["name"]})


def parse_actor(text: str | None, default: Actor = UNKNOWN_HUMAN) -> Actor:
    """``"kind:id"`` (kind one of human, supervisor, scheduler) or a bare name (a human)."""
    if not text:
        return default
    kind, sep, ident = text.partition(":")
    if sep and kind in {k.value for k in ActorKind} and ident:
        return Actor(kind=ActorKind(kind), id=ident)
    return Actor(kind=ActorKind.HUMAN, id=text)


def _annotations(body: Mapping[str, Any]) -> Mapping[str, str]:
    return body.get("metadata", {}).get("annotations") or {}


def _time(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def submitted_by(body: Mapping[str, Any]) -> Actor:
    return parse_actor(_annotations(body).get(ANNOTATION_SUBMITTED_BY))


def submitted_at(body: Mapping[str, Any]) -> datetime:
    return _time(body.get("metadata", {}).get("creationTimestamp")) or utcnow()


def _cancel_time(body: Mapping[str, Any], clock: Callable[[], datetime]) -> datetime:
    """When spec.cancel was set: the latest managedFields entry that owns it, else now."""
    latest: datetime | None = None
    for entry in body.get("metadata", {}).get("managedFields") or ():
        fields = (entry.get("fieldsV1") or {}).get("f:spec") or {}
        if "f:cancel" in fields:
            when = _time(entry.get("time"))
            if when is not None and (latest is None or when > latest):
                latest = when
    return latest or clock()


def has_record(body: Mapping[str, Any]) -> bool:
    return "plan" in (body.get("status") or {})


def record_from(body: Mapping[str, Any], *, clock: Callable[[], datetime] = utcnow) -> Record:
    """The record a DispatchJob holds (spec + status); raises JobNotFound when it holds none yet."""
    meta = body["metadata"]
    job = job_id(meta["namespace"], meta["name"])
    status = body.get("status") or {}
    if "plan" not in status:
        raise JobNotFound(job)
    data = {k: status[k] for k in RECORD_FIELDS if k in status}
    record = Record.model_validate({**data, "job": job, "spec": job_spec(body)})
    if record.cancel is None and (body.get("spec") or {}).get("cancel"):
        actor = parse_actor(_annotations(body).get(ANNOTATION_CANCELLED_BY))
        record = record.model_copy(
            update={"cancel": CancelRequest(actor=actor, time=_cancel_time(body, clock))}
        )
    return record


def record_status(record: Record) -> dict[str, Any]:
    """The record as the status holds it (camelCase, no nulls, without job and spec)."""
    data: dict[str, Any] = record.model_dump(
        mode="json", by_alias=True, exclude_none=True, exclude={"job", "spec"}
    )
    return data


def new_record(body: Mapping[str, Any], spec: JobSpec, plan: Plan) -> Record:
    """The first record of a DispatchJob: planned, supervised, nothing authorized yet."""
    meta = body["metadata"]
    return Record(
        job=job_id(meta["namespace"], meta["name"]),
        spec=spec,
        plan=plan,
        submitted_by=submitted_by(body),
        submitted_at=submitted_at(body),
        supervised=True,
    )


# ---- conditions ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Condition:
    type: str
    status: bool
    reason: str
    message: str


def _outcome_message(record: Record) -> str:
    cause = record.cause
    what = cause.kind.value + (f" ({cause.detail})" if cause.detail else "")
    if record.state is State.SUCCEEDED:
        return f"succeeded in submission {len(record.submissions)}"
    if record.state is State.CANCELLED:
        return f"cancelled by {record.cancel.actor}" if record.cancel else f"cancelled: {cause.detail}"
    index = record.spec.recovery.rule_for(cause.kind)
    if index is None:
        if cause.kind in record.plan.uncovered:
            return f"failed: cause {what} is not covered by any rule"
        return f"failed: cause {what}"
    rule = record.plan.rules[index]
    if rule.left == 0 and rule.enforcer is Enforcer.SUPERVISOR:
        return f"failed: cause {what}; rule {index} has used its budget ({rule.firings}/{rule.budget})"
    return f"failed: cause {what} (rule {index}, enforced by the {rule.enforcer})"


def conditions_for(record: Record) -> list[Condition]:
    """The kstatus conditions of a record (see the module docstring)."""
    state = record.state
    n = len(record.submissions)
    if not state.is_outcome:
        if state is State.RECOVERING:
            cause = record.cause.kind.value
            reason, message = REASON_RECOVERING, f"recovering from {cause}: submission {n} authorized"
        elif n:
            reason, message = REASON_PENDING, f"submission {n} authorized"
        else:
            reason, message = REASON_PENDING, "planned; no submission authorized yet"
        return [
            Condition(COND_READY, False, reason, message),
            Condition(COND_RECONCILING, True, reason, message),
            Condition(COND_SUCCEEDED, False, reason, message),
            Condition(COND_FAILED, False, reason, message),
        ]
    message = _outcome_message(record)
    reason = {
        State.SUCCEEDED: REASON_SUCCEEDED,
        State.FAILED: REASON_FAILED,
        State.CANCELLED: REASON_CANCELLED,
    }[state]
    out = [
        Condition(COND_READY, state is State.SUCCEEDED and record.settled, reason, message),
        Condition(COND_SUCCEEDED, state is State.SUCCEEDED, reason, message),
        Condition(COND_FAILED, state is not State.SUCCEEDED, reason, message),
    ]
    if not record.settled:
        out.append(Condition(COND_RECONCILING, True, reason, f"{message}; ending the job's objects"))
    elif state is not State.SUCCEEDED:
        out.append(Condition(COND_STALLED, True, reason, message))
    return out


def refusal_conditions(reason: str, message: str) -> list[Condition]:
    """A job dispatch refuses (nothing will be created): not ready, stalled, failed."""
    return [
        Condition(COND_READY, False, reason, message),
        Condition(COND_STALLED, True, reason, message),
        Condition(COND_SUCCEEDED, False, reason, message),
        Condition(COND_FAILED, True, reason, message),
    ]


def render_conditions(
    conditions: Iterable[Condition], previous: Sequence[Mapping[str, Any]], generation: int, now: datetime
) -> list[dict[str, Any]]:
    """metav1.Conditions, keeping lastTransitionTime where the status did not change."""
    before = {c.get("type"): c for c in previous}
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    out = []
    for c in conditions:
        status = "True" if c.status else "False"
        old = before.get(c.type)
        changed = old is None or old.get("status") != status
        out.append(
            {
                "type": c.type,
                "status": status,
                "observedGeneration": generation,
                "lastTransitionTime": stamp if changed else old["lastTransitionTime"],  # type: ignore[index]
                "reason": c.reason,
                "message": c.message[:32768],
            }
        )
    return out


# ---- the store -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Seen:
    version: str
    generation: int
    conditions: tuple[Mapping[str, Any], ...]
    observed: dict[str, str]
    """The observed fields (:data:`OBSERVED_FIELDS`) as that version holds them."""


OBSERVED_FIELDS: Final = (STATUS_OBSERVED_STATE, STATUS_OBSERVED_CAUSE)


def observed_fields(state: State, cause: Cause) -> dict[str, str]:
    """The observed status fields for what an observer sees now (no cause: the field is absent)."""
    fields = {STATUS_OBSERVED_STATE: str(state)}
    if cause.kind is not CauseKind.NONE:
        fields[STATUS_OBSERVED_CAUSE] = str(cause.kind)
    return fields


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
        body = self._fresh.get(job) if self.cache and job in self._subscribers else None
        if body is None:
            body = await self.read(job)
        return Versioned(record_from(body, clock=self.clock), str(body["metadata"]["resourceVersion"]))

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
        # The PUT replaces the status: carry the observed fields over, or set them when the record
        # settles (nothing changes after that, so the observer would only write them again).
        status.update(observed_fields(record.state, record.cause) if record.settled else seen.observed)
        return await self._put_status(record.job, status, expected)

    async def observe(self, job: str, state: State, cause: Cause, expected: str) -> str | None:
        """Write the observed fields when they differ from those of version ``expected``, else nothing.

        The record store's own compare-and-swap PUT of /status (a stale ``expected`` raises
        VersionConflict), remembered like a record write, so the next step reads it from the cache
        and its write does not conflict with this one. Returns the new version, None when unchanged.
        """
        fields = observed_fields(state, cause)
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
        if _observed_of(body) == fields:
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
            observed=_observed_of(body),
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
                    self._fresh.pop(job, None)
                    self._seen.pop(job, None)

        return unsubscribe

    def _start_watches(self) -> None:
        if self._watches:
            return
        loop = asyncio.get_running_loop()
        self._watches = [
            loop.create_task(self._watch(namespace), name=f"dispatch-store-watch-{namespace or 'all'}")
            for namespace in self.namespaces
        ]

    async def _watch(self, namespace: str | None) -> None:
        async for event in watch_forever(self.objects, namespace):
            self._dispatch(event)

    def _dispatch(self, event: WatchEvent) -> None:
        meta = event.object.get("metadata") or {}
        if "name" not in meta or "namespace" not in meta:
            return
        job = job_id(meta["namespace"], meta["name"])
        fresh = self._fresh.get(job)
        if fresh is not None and (
            event.type == "DELETED" or fresh["metadata"].get("resourceVersion") != meta.get("resourceVersion")
        ):
            del self._fresh[job]
        if event.type == "DELETED":
            self._seen.pop(job, None)
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


def _observed_of(body: Mapping[str, Any]) -> dict[str, str]:
    status = body.get("status") or {}
    return {k: str(status[k]) for k in OBSERVED_FIELDS if k in status}


def refusal(body: Mapping[str, Any]) -> str | None:
    """The reason the current generation was refused (a status with Stalled=True and no record), if so."""
    status = body.get("status") or {}
    if "plan" in status:
        return None
    generation = int(body.get("metadata", {}).get("generation") or 0)
    if status.get("observedGeneration") != generation:
        return None
    for c in status.get("conditions") or ():
        if c.get("type") == COND_STALLED and c.get("status") == "True":
            return str(c.get("reason"))
    return None


__all__ = [
    "KubeRecordStore",
    "conditions_for",
    "has_record",
    "job_spec",
    "new_record",
    "record_from",
    "record_status",
    "refusal",
]

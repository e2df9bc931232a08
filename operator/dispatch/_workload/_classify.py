"""From a workload object and its pods to an :class:`~dispatch.ObjectView`: phase, cause, restarts.

Pure functions, no I/O: the clock and what is known about nodes are passed in; what differs between
kinds comes from the :class:`~dispatch._workload.Kind`.

The cause comes from the most precise signal: the pods first (disruption, termination reason, exit
code, waiting reason, scheduling: :mod:`._evidence`), then the object's own status (the kind's
:meth:`~dispatch._workload.Kind.outcome`), and ``unknown`` is what is left.
"""

from __future__ import annotations

import json
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from .._constants import (
    ANNOTATION_ENDED,
    ANNOTATION_RELEASED,
    OBJECT_FINALIZER,
    REPORTING_COMPONENT,
)
from .._model import Cause, CauseKind, ObjectView, Phase
from ._evidence import DISRUPTIONS, Evidence, best, kind_evidence, waiting_note
from ._fields import detail, no_capacity_after, object_id, owner_of, parse_time, restart_budget
from ._kind import Kind
from ._kueue import WorkloadView, queued_verdict
from ._mask import Body


@dataclass(frozen=True, slots=True)
class Verdict:
    view: ObjectView
    stop: Cause | None = None
    """The adapter must stop the object itself (the scheduler would go on): record this cause."""
    stop_after_grace: bool = False
    """The scheduler ends it by itself too, normally: the stop waits the adapter's grace first."""
    recheck_at: float | None = None
    """A wall-clock time (epoch seconds) at which the verdict may change with no event."""


def classify(
    kind: Kind,
    body: Body,
    pods: Iterable[Mapping[str, Any]],
    *,
    now: float,
    gone_nodes: Container[str] = (),
    retained: Evidence | None = None,
    last_restart: Cause | None = None,
    restarts_seen: int = 0,
    workload: WorkloadView | None = None,
    started: datetime | None = None,
) -> Verdict:
    """The view of one object from its body, its pods and what was seen of pods already gone, and
    for a queued job's object its Kueue Workload (``workload``, see ``dispatch._workload._kueue``).

    ``restarts_seen``: the in-place restarts the adapter counted over every incarnation of the
    object's pods (a recreated pod starts again from 0). ``started``: the earliest start the
    adapter saw of its pods, kept for when they are gone."""
    pods = list(pods)
    restarts, budget, past_budget = _in_place_restarts(kind, body, pods, restarts_seen)
    said = _read_pods(kind, body, pods, now=now, gone_nodes=gone_nodes, retained=retained)
    # The adapter's last_restart is the latest restart it saw happen; without it, the latest here.
    restart_cause = last_restart or (said.restart_causes[-1] if said.restart_causes else None)
    view = _Views.of(body, restarts, _earliest(started, pods_started(pods)))
    ended = _ended(kind, body, view, said.evidence, restart_cause)
    if ended is not None:
        return ended
    if past_budget:
        # Its scheduler ends it too, normally at once; but a controller may delete the pods before
        # it writes Failed, and when that write fails its next pass no longer sees the restarts
        # and creates the pods anew: a run the rule does not allow. Stopped after the grace unless
        # the scheduler has ended it by then.
        cause = restart_cause or Cause(
            kind=CauseKind.NON_ZERO_EXIT, detail=f"restarted in place past the rule's budget of {budget}"
        )
        return Verdict(view(Phase.ENDED, cause), stop=cause, stop_after_grace=True)
    kueue = queued_verdict(kind, body, pods, workload, now=now, no_capacity_after=no_capacity_after(body))
    if kueue is not None:
        return Verdict(
            view(kueue.phase, kueue.cause, kueue.cancelled, waiting=kueue.waiting),
            stop=kueue.cause if kueue.stop else None,
            recheck_at=kueue.recheck_at,
        )
    if kind.suspended(body):
        if (body.get("metadata", {}).get("annotations") or {}).get(ANNOTATION_RELEASED):
            # Released by dispatch, suspended since by someone else (Kueue evicting it, a person):
            # theirs to resume. Shown as queued, so decide never releases it a second time.
            return Verdict(view(Phase.QUEUED, note=held_outside(kind, body)))
        return Verdict(view(Phase.HELD))
    if said.running or kind.running(body):
        return Verdict(view(Phase.RUNNING, waiting=said.waiting), recheck_at=said.recheck)
    return Verdict(view(Phase.QUEUED, waiting=said.waiting), recheck_at=said.recheck)


def _in_place_restarts(
    kind: Kind, body: Body, pods: list[Mapping[str, Any]], restarts_seen: int
) -> tuple[int, int | None, bool]:
    """(restarts shown, the rule's budget, past it) for an object restarting pods in place."""
    if not kind.in_place(body):
        return 0, None, False
    own = kind.object_restarts(body)
    restarts = own if own is not None else max(sum(kind.restarts(dict(p)) for p in pods), restarts_seen)
    budget = restart_budget(body)
    if budget is None:
        return restarts, None, False
    # One failure more than the rule's budget ends the object (the scheduler's own limit, e.g. a
    # backoffLimit of budget + 1, says so too).
    return min(restarts, budget), budget, restarts > budget


@dataclass(frozen=True, slots=True)
class _PodsSay:
    """What the object's pods say together."""

    evidence: Evidence | None
    """The best terminal evidence (what was retained of pods gone included)."""
    restart_causes: list[Cause]
    """The causes of in-place restarts, in the pods' order."""
    recheck: float | None
    running: bool
    waiting: str


def _read_pods(
    kind: Kind,
    body: Body,
    pods: list[Mapping[str, Any]],
    *,
    now: float,
    gone_nodes: Container[str],
    retained: Evidence | None,
) -> _PodsSay:
    terminal: list[Evidence] = [retained] if retained is not None else []
    restart_causes: list[Cause] = []
    recheck: float | None = None
    running = False
    waiting = ""
    wait_limit = no_capacity_after(body)
    for pod in pods:
        found, at = kind_evidence(kind, body, pod, now=now, gone_nodes=gone_nodes)
        if found is not None and found.terminal:
            terminal.append(found)
        elif found is not None:
            restart_causes.append(found.cause)
        if not waiting:
            waiting, due = waiting_note(pod, now=now, no_capacity_after_seconds=wait_limit)
            if due is not None:
                at = due if at is None else min(at, due)
        if at is not None:
            recheck = at if recheck is None else min(recheck, at)
        if pod.get("status", {}).get("phase") == "Running" and not pod.get("metadata", {}).get(
            "deletionTimestamp"
        ):
            running = True
    return _PodsSay(best(terminal), restart_causes, recheck, running, waiting)


@dataclass(frozen=True, slots=True)
class _Views:
    """Makes the views of one object: what every view of it shares, and its phase."""

    oid: str
    job: str
    submission: int
    restarts: int
    held: bool
    """Deleted by someone else, kept by dispatch's finalizer until the record has it (always ended)."""
    started: datetime | None

    @classmethod
    def of(cls, body: Body, restarts: int, started: datetime | None) -> _Views:
        owner = owner_of(body)
        job, submission = owner if owner is not None else ("", 0)
        meta = body.get("metadata", {})
        held = bool(meta.get("deletionTimestamp")) and OBJECT_FINALIZER in (meta.get("finalizers") or ())
        return cls(object_id(body), job, submission, restarts, held, started)

    def __call__(
        self,
        phase: Phase,
        cause: Cause | None = None,
        cancelled: bool = False,
        note: str = "",
        waiting: str = "",
    ) -> ObjectView:
        return ObjectView(
            id=self.oid,
            job=self.job,
            submission=self.submission,
            phase=phase,
            cause=cause,
            cancelled=cancelled,
            restarts=self.restarts,
            retained=self.held,
            note=note,
            waiting=waiting,
            started_at=self.started if phase in (Phase.RUNNING, Phase.ENDED) else None,
        )


def pods_started(pods: Iterable[Mapping[str, Any]]) -> datetime | None:
    """When the object's workload began running: the earliest start of a container of its pods
    (running or ended, this incarnation or the last), or a running pod's ``startTime`` when its
    containers do not say; None while none has run."""
    found: datetime | None = None
    for pod in pods:
        status = pod.get("status") or {}
        times = [
            state.get("startedAt")
            for c in status.get("containerStatuses") or ()
            for state in (
                (c.get("state") or {}).get("running") or {},
                (c.get("state") or {}).get("terminated") or {},
                (c.get("lastState") or {}).get("terminated") or {},
            )
        ]
        began = [t for t in (_time(v) for v in times) if t is not None]
        if not began and status.get("phase") == "Running":
            began = [t for t in (_time(status.get("startTime")),) if t is not None]
        for at in began:
            found = _earliest(found, at)
    return found


def _time(value: object) -> datetime | None:
    epoch = parse_time(value)
    return datetime.fromtimestamp(epoch, UTC) if epoch is not None else None


def _earliest(a: datetime | None, b: datetime | None) -> datetime | None:
    if a is None or b is None:
        return a or b
    return min(a, b)


def _ended(
    kind: Kind, body: Body, view: _Views, evidence: Evidence | None, restart_cause: Cause | None
) -> Verdict | None:
    """The end that dispatch's annotation, the object's own status, its deletion or its pods say."""
    meta = body.get("metadata", {})
    ended = (meta.get("annotations") or {}).get(ANNOTATION_ENDED)
    if ended:
        try:
            cause = Cause.model_validate(json.loads(ended))
        except ValueError:
            cause = Cause(kind=CauseKind.UNKNOWN, detail=detail("unreadable annotation", ANNOTATION_ENDED))
        # dispatch stops an object with no cause only when it was cancelled outside dispatch (its
        # Workload deactivated in Kueue): read back as that cancel.
        return Verdict(view(Phase.ENDED, cause, cancelled=cause.kind is CauseKind.NONE))
    outcome = kind.outcome(body, restart_cause)
    if outcome is not None:
        # A pod stopped by a disruption whose program exited 0 on its SIGTERM counts as succeeded
        # for its controller: the object says done, the pod says why it stopped before it was.
        stopped = evidence is not None and evidence.cause.kind in DISRUPTIONS
        cause = evidence.cause if evidence is not None and (outcome.failed or stopped) else outcome.cause
        return Verdict(view(Phase.ENDED, cause))
    if meta.get("deletionTimestamp"):
        cause = evidence.cause if evidence is not None else Cause(kind=CauseKind.NONE, detail="deleted")
        return Verdict(view(Phase.ENDED, cause, cancelled=evidence is None))
    if evidence is not None:
        return Verdict(view(Phase.ENDED, evidence.cause), stop=evidence.cause)
    return None


def held_outside(kind: Kind, body: Body) -> str:
    """Who suspended a released object: the field manager that owns its suspend field now (the
    latest writer of it, from managedFields), when that is not dispatch itself."""
    path = kind.suspend_patch(True)
    owners: list[tuple[str, str]] = []
    for entry in body.get("metadata", {}).get("managedFields") or ():
        fields: Any = entry.get("fieldsV1") or {}
        step: Any = path
        while isinstance(step, dict) and len(step) == 1 and isinstance(fields, dict):
            key = next(iter(step))
            fields, step = fields.get(f"f:{key}"), step[key]
        if fields is not None and not isinstance(step, dict) and entry.get("manager") != REPORTING_COMPONENT:
            owners.append((str(entry.get("time") or ""), str(entry.get("manager") or "")))
    who = max(owners)[1] if owners else ""
    by = f" by {who}" if who else ""
    return f"suspended{by} after dispatch released it; held outside dispatch until resumed there"


def vanished(last: ObjectView) -> ObjectView:
    """The view of an object deleted from the API server after it was seen as ``last``."""
    if last.phase is Phase.ENDED:
        return last.model_copy(update={"retained": False}) if last.retained else last
    return last.model_copy(
        update={
            "phase": Phase.ENDED,
            "cause": Cause(kind=CauseKind.NONE, detail="deleted"),
            "cancelled": True,
        }
    )

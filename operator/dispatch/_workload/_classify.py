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
from typing import Any

from .._constants import (
    ANNOTATION_ENDED,
    ANNOTATION_RELEASED,
    OBJECT_FINALIZER,
    REPORTING_COMPONENT,
)
from .._model import Cause, CauseKind, ObjectView, Phase
from ._evidence import Evidence, best, kind_evidence, waiting_note
from ._fields import detail, no_capacity_after, object_id, owner_of, restart_budget
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
) -> Verdict:
    """The view of one object from its body, its pods and what was seen of pods already gone, and
    for a queued job's object its Kueue Workload (``workload``, see ``dispatch._workload._kueue``).

    ``restarts_seen``: the in-place restarts the adapter counted over every incarnation of the
    object's pods (a recreated pod starts again from 0)."""
    owner = owner_of(body)
    job, submission = owner if owner is not None else ("", 0)
    oid = object_id(body)
    meta = body.get("metadata", {})
    annotations = meta.get("annotations") or {}
    restarts_in_place = kind.in_place(body)
    pods = list(pods)

    restarts = 0
    past_budget = False
    if restarts_in_place:
        own = kind.object_restarts(body)
        restarts = own if own is not None else max(sum(kind.restarts(dict(p)) for p in pods), restarts_seen)
        budget = restart_budget(body)
        if budget is not None:
            # One failure more than the rule's budget ends the object (the scheduler's own limit,
            # e.g. the training operator's backoffLimit = budget + 1, says so too).
            past_budget = restarts > budget
            restarts = min(restarts, budget)

    terminal: list[Evidence] = [retained] if retained is not None else []
    restart_causes: list[Cause] = [last_restart] if last_restart is not None else []
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
    evidence = best(terminal)
    # The adapter's last_restart is the latest restart it saw happen; without it, the latest here.
    restart_cause = last_restart or (restart_causes[-1] if restart_causes else None)

    # Deleted by someone else, kept by dispatch's finalizer until the record has it (always ended).
    held = bool(meta.get("deletionTimestamp")) and OBJECT_FINALIZER in (meta.get("finalizers") or ())

    def view(
        phase: Phase, cause: Cause | None = None, cancelled: bool = False, note: str = "", waiting: str = ""
    ) -> ObjectView:
        return ObjectView(
            id=oid,
            job=job,
            submission=submission,
            phase=phase,
            cause=cause,
            cancelled=cancelled,
            restarts=restarts,
            retained=held,
            note=note,
            waiting=waiting,
        )

    ended = annotations.get(ANNOTATION_ENDED)
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
        cause = evidence.cause if outcome.failed and evidence is not None else outcome.cause
        return Verdict(view(Phase.ENDED, cause))
    if meta.get("deletionTimestamp"):
        cause = evidence.cause if evidence is not None else Cause(kind=CauseKind.NONE, detail="deleted")
        return Verdict(view(Phase.ENDED, cause, cancelled=evidence is None))
    if evidence is not None:
        return Verdict(view(Phase.ENDED, evidence.cause), stop=evidence.cause)
    if past_budget:
        # Its scheduler ends it too, normally at once; but the training operator deletes the pods
        # before it writes Failed, and when that write fails its next pass no longer sees the
        # restarts and creates the pods anew: a run the rule does not allow. Stopped after the
        # grace unless the scheduler has ended it by then.
        cause = restart_cause or Cause(
            kind=CauseKind.NON_ZERO_EXIT, detail=f"restarted in place past the rule's budget of {budget}"
        )
        return Verdict(view(Phase.ENDED, cause), stop=cause, stop_after_grace=True)
    kueue = queued_verdict(kind, body, pods, workload, now=now, no_capacity_after=wait_limit)
    if kueue is not None:
        return Verdict(
            view(kueue.phase, kueue.cause, kueue.cancelled, waiting=kueue.waiting),
            stop=kueue.cause if kueue.stop else None,
            recheck_at=kueue.recheck_at,
        )
    if kind.suspended(body):
        if annotations.get(ANNOTATION_RELEASED):
            # Released by dispatch, suspended since by someone else (Kueue evicting it, a person):
            # theirs to resume. Shown as queued, so decide never releases it a second time.
            return Verdict(view(Phase.QUEUED, note=held_outside(kind, body)))
        return Verdict(view(Phase.HELD))
    if running or kind.running(body):
        return Verdict(view(Phase.RUNNING, waiting=waiting), recheck_at=recheck)
    return Verdict(view(Phase.QUEUED, waiting=waiting), recheck_at=recheck)


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

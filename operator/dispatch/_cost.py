"""What recovery cost a job: pure arithmetic on the record and the live objects, no I/O, no clock.

Each submission whose canonical ended with a failure is one :class:`Failure`:

* its **node-seconds**: the job's nodes times the time it ran, from when its canonical began running
  (``started_at``: recorded with its end, or shown by the scheduler while the object lives) to its
  recorded end (``ended_at``); a submission that never ran cost none. **GPU-seconds**: that times
  the GPUs per node its options ask for;
* its **time to recover**: from its recorded end to the next submission's start, once that
  submission has begun running; until then, or when the next one never ran, it has none.

A cancelled submission is no failure (a person ended it), and a success costs nothing. Times are
the scheduler's (a start) and the supervisor's (a recorded end), so a figure that would come out
negative between two clocks is taken as zero.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from ._model import FAILURE_CAUSES, CauseCost, CauseKind, Cost, ObjectView, Record, Submission


@dataclass(frozen=True, slots=True)
class Failure:
    """One submission that ended with a failure, and what it cost."""

    submission: int
    cause: CauseKind
    node_seconds: float
    gpu_seconds: float
    recovery_seconds: float | None
    """From its recorded end to the next submission running; None until that one runs."""


def started(sub: Submission, objects: Sequence[ObjectView]) -> datetime | None:
    """When ``sub``'s canonical began running: recorded with its end, else as the scheduler shows it."""
    if sub.started_at is not None or sub.canonical is None:
        return sub.started_at
    view = next((o for o in objects if o.id == sub.canonical), None)
    return view.started_at if view is not None else None


def _seconds(start: datetime, end: datetime) -> float:
    return max((end - start).total_seconds(), 0.0)


def failures(record: Record, objects: Sequence[ObjectView] = ()) -> tuple[Failure, ...]:
    """Every submission of ``record`` that ended with a failure, in order, with what it cost."""
    nodes = record.spec.nodes
    gpus = record.spec.gpus_per_node()
    subs = record.submissions
    out: list[Failure] = []
    for i, sub in enumerate(subs):
        cause = sub.cause
        if cause is None or cause.kind is CauseKind.NONE or sub.ended_at is None:
            continue
        began = started(sub, objects)
        node_seconds = nodes * _seconds(began, sub.ended_at) if began is not None else 0.0
        nxt = started(subs[i + 1], objects) if i + 1 < len(subs) else None
        recovery = _seconds(sub.ended_at, nxt) if nxt is not None else None
        out.append(Failure(sub.n, cause.kind, node_seconds, node_seconds * gpus, recovery))
    return tuple(out)


def _round(seconds: float) -> float:
    """To the millisecond: what status shows changes only when a figure does."""
    return round(seconds, 3)


def recovery_cost(record: Record, objects: Sequence[ObjectView] = ()) -> Cost:
    """What recovery has cost ``record``'s job so far, in total and per cause (see the module)."""
    found = failures(record, objects)
    if not found:
        return Cost()
    causes: list[CauseCost] = []
    for kind in FAILURE_CAUSES:
        mine = [f for f in found if f.cause is kind]
        if not mine:
            continue
        recovered = [f.recovery_seconds for f in mine if f.recovery_seconds is not None]
        causes.append(
            CauseCost(
                cause=kind,
                failures=len(mine),
                recovered=len(recovered),
                recovery_seconds=_round(sum(recovered)),
                longest_recovery_seconds=_round(max(recovered, default=0.0)),
                node_seconds=_round(sum(f.node_seconds for f in mine)),
                gpu_seconds=_round(sum(f.gpu_seconds for f in mine)),
            )
        )
    return Cost(
        failures=len(found),
        recovered=sum(c.recovered for c in causes),
        recovery_seconds=_round(sum(f.recovery_seconds or 0.0 for f in found)),
        node_seconds=_round(sum(f.node_seconds for f in found)),
        gpu_seconds=_round(sum(f.gpu_seconds for f in found)),
        causes=tuple(causes),
    )

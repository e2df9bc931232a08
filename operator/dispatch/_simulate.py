"""The plan's "what if": walk a job's rules over a sequence of causes, with the core's own decision.

:func:`simulate` builds the job's record in memory and plays the supervisor's part against an
imagined scheduler: each submission's object starts, then ends with the next cause of the
sequence (or succeeds once the sequence is spent). Every step is :func:`~dispatch.decide`'s, every
record change :func:`~dispatch._decide.apply`'s, and a backoff passes by advancing the simulation's
own clock (:func:`~dispatch.due`), so the answer cannot disagree with what a supervisor does. Pure:
no I/O, no clock read.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Final

from ._decide import WRITES, Create, Done, End, Release, Wait, apply, decide, due
from ._model import (
    FAILURE_CAUSES,
    NO_CAUSE,
    SUPERVISOR,
    Action,
    Actor,
    ActorKind,
    Cause,
    CauseKind,
    Enforcer,
    JobSpec,
    ObjectView,
    Phase,
    Plan,
    Record,
    SimulatedEnd,
    Simulation,
    State,
)

SIMULATION_START: Final = datetime(2000, 1, 1, tzinfo=UTC)
"""The simulated clock's start: times in a simulation are read as offsets from it."""
SIMULATION_ACTOR: Final = Actor(kind=ActorKind.HUMAN, id="simulation")
MAX_SIMULATED_STEPS: Final = 100_000
"""A bound no real plan reaches (budgets are bounded): a loop in the decision is a bug, said as one."""


def parse_cause(text: str) -> Cause:
    """A cause as a command line gives it: its kind (``preempted``), with an exit code after a colon
    for ``non-zero-exit:3`` (or ``out-of-memory:137``); ``none`` is a success."""
    kind, _, code = text.strip().partition(":")
    try:
        cause_kind = CauseKind(kind.strip())
    except ValueError:
        known = ", ".join(c.value for c in (*FAILURE_CAUSES, CauseKind.NONE))
        raise ValueError(f"{text.strip()!r} is not a cause: one of {known}") from None
    if not code:
        return Cause(kind=cause_kind, detail="simulated")
    try:
        exit_code = int(code)
    except ValueError:
        raise ValueError(f"{text.strip()!r}: the exit code after ':' must be an integer") from None
    return Cause(kind=cause_kind, detail="simulated", exit_code=exit_code)


def simulate(
    spec: JobSpec, plan: Plan, causes: Iterable[Cause | str], *, start: datetime = SIMULATION_START
) -> Simulation:
    """Walk ``spec``'s rules, as ``plan`` assigns them, over ``causes``: the ends of submissions 1,
    2, ... in order (a string is read by :func:`parse_cause`). Once they are spent the next
    submission succeeds. The plan is the one the operator makes (``make_plan(..., supervised=True)``).
    """
    given = deque(c if isinstance(c, Cause) else parse_cause(c) for c in causes)
    record = Record(
        job=plan.job,
        spec=spec,
        plan=plan,
        submitted_by=SIMULATION_ACTOR,
        submitted_at=start,
        supervised=True,
    )
    objects: dict[str, ObjectView] = {}
    restarts: dict[int, list[SimulatedEnd]] = {}
    now = start
    for _ in range(MAX_SIMULATED_STEPS):
        decision = due(decide(record, tuple(objects.values())), now)
        step = decision.step
        if isinstance(step, Done):
            return _result(record, tuple(given), restarts)
        if isinstance(step, WRITES):
            record = apply(record, step, actor=SUPERVISOR, now=now)
        elif isinstance(step, Create):
            oid = f"{plan.job}-{step.submission}"
            objects[oid] = ObjectView(id=oid, job=plan.job, submission=step.submission, phase=Phase.HELD)
        elif isinstance(step, Release):
            objects[step.object_id] = objects[step.object_id].model_copy(update={"phase": Phase.RUNNING})
        elif isinstance(step, End):
            objects[step.object_id] = objects[step.object_id].model_copy(
                update={"phase": Phase.ENDED, "cancelled": True}
            )
        elif isinstance(step, Wait) and step.until is not None:
            now = max(now, step.until)  # the backoff passes
        else:  # the canonical runs: the imagined scheduler ends it with the next cause
            running = [o for o in objects.values() if o.phase is not Phase.ENDED]
            if not running:
                raise RuntimeError(f"simulation stuck: {step}")
            cause = given.popleft() if given else NO_CAUSE
            for view in running:
                restart = _restarting_rule(record, view, cause)
                if restart is not None:
                    restarts.setdefault(view.submission, []).append(
                        _restart(view.submission, cause, restart, record.plan.rules[restart].budget, view)
                    )
                    objects[view.id] = view.model_copy(update={"restarts": view.restarts + 1})
                else:
                    objects[view.id] = view.model_copy(update={"phase": Phase.ENDED, "cause": cause})
    raise RuntimeError(f"simulation did not settle within {MAX_SIMULATED_STEPS} steps")


def _restarting_rule(record: Record, view: ObjectView, cause: Cause) -> int | None:
    """The scheduler-enforced rule that restarts ``view`` in place after ``cause``, with budget left."""
    index = record.spec.recovery.rule_for(cause)
    if index is None or index >= len(record.plan.rules):
        return None
    rule = record.plan.rules[index]
    if rule.enforcer is Enforcer.SCHEDULER and rule.action is Action.RESTART and view.restarts < rule.budget:
        return index
    return None


def _restart(n: int, cause: Cause, rule: int, budget: int, view: ObjectView) -> SimulatedEnd:
    return SimulatedEnd(
        submission=n,
        cause=cause,
        rule=rule,
        next_submission=n,
        budget_left=budget - view.restarts - 1,
        in_place=True,
        state=State.RECOVERING,
    )


def _result(record: Record, unused: tuple[Cause, ...], restarts: dict[int, list[SimulatedEnd]]) -> Simulation:
    """The ends a settled simulated record holds, read from its submissions (with the scheduler's
    restarts in place, which no submission records one by one)."""
    subs = record.submissions
    fired: dict[int, int] = {}
    ends: list[SimulatedEnd] = []
    for i, sub in enumerate(subs):
        ends.extend(restarts.get(sub.n, ()))
        nxt = subs[i + 1] if i + 1 < len(subs) else None
        cause = sub.cause or NO_CAUSE
        if nxt is None:
            ends.append(SimulatedEnd(submission=sub.n, cause=cause, state=record.state))
            continue
        rule = nxt.rule
        left = None
        if rule is not None:
            fired[rule] = fired.get(rule, 0) + 1
            left = max(record.plan.rules[rule].budget - fired[rule], 0)
        wait = (nxt.authorized_at - sub.ended_at).total_seconds() if sub.ended_at is not None else 0.0
        ends.append(
            SimulatedEnd(
                submission=sub.n,
                cause=cause,
                rule=rule,
                backoff_seconds=wait,
                next_submission=nxt.n,
                budget_left=left,
                change="; ".join(str(c) for c in nxt.changes),
                state=State.RECOVERING,
            )
        )
    return Simulation(ends=tuple(ends), state=record.state, cause=record.cause, unused=unused, record=record)

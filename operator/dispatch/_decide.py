"""One pure decision function: (record, the job's tagged objects) -> the next step.

The supervisor acts on the step; the observer shows the state the same decision implies. Because
both call :func:`decide`, they never disagree: between the end of submission 1 and the authorization
of submission 2, status is ``recovering`` with the cause, never ``failed``.

Nothing here does I/O or reads a clock. :func:`apply` turns a write step into the next record,
with the time passed in. A rule's backoff, a submission's time limit and the job's deadline are each
a :class:`Wait` with the time it ends, computed from the record and the object's observed start:
:func:`due` (given the time by the supervisor) turns it into the step it waits for once that time
has come. So a restarted supervisor waits exactly as long as the one before it would have.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Final

from ._change import next_changes
from ._cost import recovery_cost
from ._model import (
    NO_CAUSE,
    SCHEDULER,
    Action,
    Actor,
    Cause,
    CauseKind,
    Enforcer,
    JobSpec,
    ObjectView,
    Phase,
    Plan,
    Record,
    State,
    Status,
    StopKind,
    StopRequest,
    Submission,
    SubmissionStatus,
    Transition,
    cause_words,
)

# Steps: what decide() says to do next. They are public (dispatch.Authorize, ...) because
# decide() returns them; a supervisor's Listener receives them. Writes change the record (one
# compare-and-swap each); actions call the backend; Wait and Done do nothing.


@dataclass(frozen=True, slots=True)
class Authorize:
    """Write: authorize ``submission``; for n > 1 count the firing of ``rule`` in the same write."""

    submission: int
    rule: int | None = None
    cause: Cause | None = None
    """How the previous canonical ended, recorded with the authorization."""
    started_at: datetime | None = None
    """When the previous canonical began running, recorded with its end (what it cost)."""


@dataclass(frozen=True, slots=True)
class Create:
    """Action: create the object of ``submission`` held back and tagged."""

    submission: int


@dataclass(frozen=True, slots=True)
class RecordCanonical:
    """Write: ``object_id`` is the one real object of ``submission``; any other is an orphan."""

    submission: int
    object_id: str


@dataclass(frozen=True, slots=True)
class Release:
    """Action: let the canonical object start."""

    object_id: str


@dataclass(frozen=True, slots=True)
class End:
    """Action: end an object (an orphan, or a live object of a job that has an outcome)."""

    object_id: str
    orphan: bool
    stop: CauseKind | None = None
    """Set when the supervisor stops the canonical (its time limit, the deadline)."""
    grace_seconds: int | None = field(default=None, compare=False)
    """SIGTERM to SIGKILL: the job's ``stop.gracePeriodSeconds``, or ``stop.warningSeconds`` for a
    time limit's stop begun that early (so that the kill comes at the limit)."""


@dataclass(frozen=True, slots=True)
class RecordEnd:
    """Write: ``submission``'s canonical ended with ``cause``, which ``rule`` answers once its
    backoff has passed; the cause is recorded now, with the time the backoff counts from."""

    submission: int
    rule: int
    cause: Cause
    started_at: datetime | None = None
    """When the canonical began running, recorded with its end."""


@dataclass(frozen=True, slots=True)
class RecordStop:
    """Write: the supervisor begins to stop ``submission``'s canonical, whose end is then recorded
    as ``cause`` (``time-limit``, ``deadline-exceeded``), not read as a cancel."""

    submission: int
    cause: Cause


@dataclass(frozen=True, slots=True)
class RecordRestarts:
    """Write: the scheduler restarted the canonical in place under a scheduler-enforced rule."""

    submission: int
    restarts: int


@dataclass(frozen=True, slots=True)
class RecordOutcome:
    """Write: the job ends ``state`` with ``cause``; ``actor`` None means the supervisor writing it."""

    state: State
    cause: Cause
    actor: Actor | None = None
    started_at: datetime | None = None
    """When the current canonical began running, recorded with its end."""


@dataclass(frozen=True, slots=True)
class RecordSuspend:
    """Write: a person suspended the job: the recorded state becomes ``suspended`` with ``actor``;
    the current submission's live objects are ended after it (and no next one is authorized)."""

    actor: Actor


@dataclass(frozen=True, slots=True)
class Resume:
    """Write: a person's act authorizes ``submission``: the resume of a suspended job, or the
    ``retry``-th retry of a failed one (which reopens it). No rule fires and no budget is spent;
    ``fresh_budget`` names a rule whose budget a retry renews."""

    submission: int
    actor: Actor
    retry: int | None = None
    fresh_budget: int | None = None


@dataclass(frozen=True, slots=True)
class RecordSettled:
    """Write: the outcome is recorded and every object the job created has ended."""

    stop: StopKind | None = field(default=None, compare=False)
    """How the stop of a cancelled job's canonical went, now that it has ended: the outcome was
    recorded before the stop, so the record's cause takes it only here."""


@dataclass(frozen=True, slots=True)
class Wait:
    """Nothing to do until the scheduler or the record changes, or until ``until`` has come."""

    why: str
    until: datetime | None = None
    """When the wait ends by itself (a rule's backoff, a time limit, the deadline): then ``then``
    is the step to take."""
    then: Authorize | RecordStop | RecordOutcome | None = None
    """The step the wait delays (see :func:`due`)."""


@dataclass(frozen=True, slots=True)
class Done:
    """Settled: nothing will ever be done again."""


Write = (
    Authorize
    | RecordEnd
    | RecordCanonical
    | RecordRestarts
    | RecordStop
    | RecordOutcome
    | RecordSuspend
    | Resume
    | RecordSettled
)
"""The steps that change the record."""
BackendAction = Create | Release | End
"""The steps that call the backend."""
Step = Write | BackendAction | Wait | Done
"""Every step :func:`decide` can return."""
WRITES = (
    Authorize,
    RecordEnd,
    RecordCanonical,
    RecordRestarts,
    RecordStop,
    RecordOutcome,
    RecordSuspend,
    Resume,
    RecordSettled,
)


@dataclass(frozen=True, slots=True)
class Decision:
    """What :func:`decide` answers: the next step, and the state and cause status shows now."""

    step: Step
    state: State
    """What status shows now."""
    cause: Cause
    deadline: Wait | None = None
    """The job's deadline, when it has one and ``step`` moves the job on: once its time has come,
    its step replaces ``step`` (see :func:`due`), so that nothing is resubmitted past it."""


_VANISHED = "the scheduler no longer shows the canonical object"
CANCELLED_OUTSIDE = "cancelled on the scheduler, outside dispatch"


def _id_order(object_id: str) -> tuple[int, str]:
    """Object ids in creation order where the scheduler numbers them (Slurm's job ids: ``"999"``
    before ``"1000"``), else by name."""
    return (len(object_id), object_id) if object_id.isdigit() else (0, object_id)


def decide(record: Record, objects: Sequence[ObjectView]) -> Decision:
    """The next step for ``record`` given every object tagged with its job.

    ``objects`` must have been listed *after* ``record`` was read: then an object recorded canonical
    and missing from the list has really gone, and an object of a submission the record does not know
    yet belongs to a newer record and is left alone.

    A cancel whose objects are still alive shows ``cancelling``; ``cancelled`` once all have ended.
    """
    decision = _with_deadline(record, _decide(record, objects))
    if decision.state is State.CANCELLED and not record.settled:
        latest = record.current.n if record.current is not None else 0
        if any((o.phase is not Phase.ENDED or o.terminating) and o.submission <= latest for o in objects):
            return Decision(decision.step, State.CANCELLING, decision.cause)
    return decision


def reopening(record: Record) -> bool:
    """Whether a person's retry reopens ``record``: it has failed and settled and a retry is asked."""
    return record.settled and record.state is State.FAILED and record.retry_asked is not None


def _decide(record: Record, objects: Sequence[ObjectView]) -> Decision:
    retry = record.retry_asked
    if retry is not None and reopening(record):
        # A person's retry reopens a failed job once every object it made has ended: never two
        # submissions alive at once.
        n = len(record.submissions) + 1
        step = Resume(n, retry.actor, retry=retry.n, fresh_budget=retry.fresh_budget)
        return Decision(step, State.PENDING, NO_CAUSE)
    if record.settled:
        # A slow supervisor may perform a Create it decided before the job settled: end what it
        # made, or it would outlive the settled job (held, never released, never ended).
        late = next((o for o in objects if o.phase is not Phase.ENDED or o.retained), None)
        if late is not None:
            return Decision(_end(record, late.id, orphan=not late.retained), record.state, record.cause)
        return Decision(Done(), record.state, record.cause)
    state, cause = record.state, record.cause
    outcome = state.is_outcome
    cur = record.current
    canonicals = {s.canonical for s in record.submissions if s.canonical is not None}
    latest = cur.n if cur is not None else 0
    # The current submission has no canonical yet: its objects are candidates, not orphans, until
    # one is recorded (ending one now could end what a concurrent supervisor is recording).
    choosing = not outcome and record.cancel is None and cur is not None and cur.canonical is None

    live: list[ObjectView] = []
    for o in objects:
        if o.retained and not _needed(record, o):
            return Decision(_end(record, o.id, orphan=False), *_shown(record))
        if o.phase is Phase.ENDED or (o.submission > latest and not outcome):
            continue  # (after an outcome no submission will follow: such an object is an orphan)
        if o.id in canonicals or (choosing and cur is not None and o.submission == cur.n):
            live.append(o)
            continue
        return Decision(_end(record, o.id, orphan=True), *_shown(record))

    if not outcome and record.cancel is not None:
        done = Cause(kind=CauseKind.NONE, detail=f"cancelled by {record.cancel.actor}")
        return Decision(RecordOutcome(State.CANCELLED, done, record.cancel.actor), State.CANCELLED, done)
    if outcome:
        if live:
            return Decision(_end(record, live[0].id, orphan=False), state, cause)
        if any(o.terminating for o in objects):
            return Decision(Wait("waiting for the job's processes to finish terminating"), state, cause)
        return Decision(RecordSettled(_cancel_stop(record, objects)), state, cause)
    suspension = _suspension(record, objects, live)
    if suspension is not None:
        return suspension
    if cur is None:
        return Decision(Authorize(1), State.PENDING, NO_CAUSE)

    waiting = _shown(record)
    if cur.canonical is None:
        candidates = sorted(
            (o for o in objects if o.submission == cur.n),
            key=lambda o: (o.phase is Phase.ENDED, *_id_order(o.id)),
        )
        if candidates:
            return Decision(RecordCanonical(cur.n, candidates[0].id), *waiting)
        return Decision(Create(cur.n), *waiting)

    if cur.cause is not None:
        # Its end is recorded and a backoff runs: the record decides from here, whatever the
        # scheduler shows of the ended object now (it may have been deleted since).
        return _backoff_decision(record, cur)
    view = next((o for o in objects if o.id == cur.canonical), None)
    if view is None:
        view = ObjectView(
            id=cur.canonical,
            job=record.job,
            submission=cur.n,
            phase=Phase.ENDED,
            cause=Cause(kind=CauseKind.UNKNOWN, detail=_VANISHED),
            # Gone after the supervisor began to stop it (a restarted operator no longer knows the
            # deleted object): the stop ended it.
            cancelled=cur.stop is not None,
        )
    if cur.stop is not None:
        stopping = _stop_decision(record, cur.stop, view, waiting)
        if stopping is not None:
            return stopping
        view = _stopped_view(cur.stop, view)
    shown = _view_decision(record, cur.n, view, waiting)
    if view.restarts > cur.restarts:
        # Shown as what follows once they are recorded: an unsupervised job's restarts are recorded
        # by whoever settles it, maybe never, and its status must still show the outcome.
        return Decision(RecordRestarts(cur.n, view.restarts), shown.state, shown.cause)
    return shown


def _suspension(record: Record, objects: Sequence[ObjectView], live: Sequence[ObjectView]) -> Decision | None:
    """What a person's suspend or resume calls for, or None when neither applies now.

    A suspend is recorded first, then the suspended submission's live objects are ended (by the
    stop every end makes); a resume authorizes the next submission only once they have all ended,
    so two submissions never run at once. A canonical that has already ended by itself is left to
    the rules (its success is the job's, its failure may fire a rule): the suspend then applies to
    what follows."""
    request = record.suspend
    if record.state is State.SUSPENDED:
        shown = record.cause
        if live:
            return Decision(End(live[0].id, orphan=False), State.SUSPENDED, shown)
        if any(o.terminating for o in objects):
            return Decision(
                Wait("suspended: waiting for the job's processes to finish terminating"),
                State.SUSPENDED,
                shown,
            )
        if request is None or request.suspend:
            who = request.actor if request is not None else "a person"
            return Decision(
                Wait(f"suspended by {who}: resume to authorize the next submission"), State.SUSPENDED, shown
            )
        n = len(record.submissions) + 1
        return Decision(Resume(n, request.actor), State.PENDING, NO_CAUSE)
    if request is None or not request.suspend:
        return None
    cur = record.current
    if cur is not None and cur.canonical is not None and cur.cause is None:
        view = next((o for o in objects if o.id == cur.canonical), None)
        if view is None or view.phase is Phase.ENDED:
            return None
    how = Cause(kind=CauseKind.NONE, detail=f"suspended by {request.actor}")
    return Decision(RecordSuspend(request.actor), State.SUSPENDED, how)


def _view_decision(record: Record, n: int, view: ObjectView, waiting: tuple[State, Cause]) -> Decision:
    """The decision submission ``n``'s canonical ``view`` calls for, its restarts recorded."""
    if view.phase is Phase.HELD:
        return Decision(Release(view.id), *waiting)
    if view.phase is Phase.QUEUED:
        why = view.note or view.waiting
        return Decision(
            Wait(f"queued on the scheduler: {why}" if why else "queued on the scheduler"), *waiting
        )
    if view.phase is Phase.RUNNING:
        return Decision(_time_limit_wait(record, n, view), State.RUNNING, NO_CAUSE)

    ended = view.cause or Cause(kind=CauseKind.UNKNOWN, detail="the scheduler gave no reason")
    if view.cancelled:
        how = Cause(kind=CauseKind.NONE, detail=CANCELLED_OUTSIDE)
        return Decision(RecordOutcome(State.CANCELLED, how, SCHEDULER), State.CANCELLED, how)
    # An unsupervised job's rules are all the scheduler's: its outcome is the scheduler's doing.
    by = None if record.supervised else SCHEDULER
    # When it began running goes into the write that records its end: no write of its own.
    began = view.started_at
    if ended.kind is CauseKind.NONE:
        return Decision(RecordOutcome(State.SUCCEEDED, ended, by, began), State.SUCCEEDED, ended)
    index = resubmitting_rule(record.spec, record.plan, ended)
    if index is not None:
        if backoff_seconds(record, index) > 0:
            return Decision(RecordEnd(n, index, ended, began), State.RECOVERING, ended)
        return Decision(Authorize(n + 1, index, ended, began), State.RECOVERING, ended)
    return Decision(RecordOutcome(State.FAILED, ended, by, began), State.FAILED, ended)


def _time_limit_wait(record: Record, n: int, view: ObjectView) -> Wait:
    """A running canonical's wait: until its time limit's stop begins, where the supervisor
    enforces the limit (``warningSeconds`` early), counted from when it started running."""
    limit = record.plan.time_limit
    if limit is None or limit.enforcer is not Enforcer.SUPERVISOR or view.started_at is None:
        return Wait("running")
    warning = record.spec.stop.warning_seconds or 0
    at = view.started_at + timedelta(seconds=limit.seconds - warning)
    cause = Cause(kind=CauseKind.TIME_LIMIT, detail=f"ran for its time limit of {limit.seconds} s")
    early = f" ({warning} s before its time limit)" if warning else " (its time limit)"
    return Wait(f"running; stopped at {format_time(at)}{early}", until=at, then=RecordStop(n, cause))


def _stop_decision(
    record: Record, stop: StopRequest, view: ObjectView, waiting: tuple[State, Cause]
) -> Decision | None:
    """The canonical the supervisor stops: end it, then wait out its grace period (a new
    submission does not start while the old one may still write its checkpoint); None once it
    has ended and its processes have stopped."""
    if view.phase is not Phase.ENDED:
        return Decision(_end(record, view.id, orphan=False, stop=stop.cause.kind), *waiting)
    if view.terminating:
        return Decision(Wait("stopping: the program has its grace period to exit"), *waiting)
    return None


def _cancel_stop(record: Record, objects: Sequence[ObjectView]) -> StopKind | None:
    """How the stop of a cancelled job's last canonical went, where the scheduler shows it."""
    cur = record.current
    if record.state is not State.CANCELLED or cur is None or cur.canonical is None:
        return None
    return next((o.stop for o in objects if o.id == cur.canonical), None)


def _end(record: Record, object_id: str, *, orphan: bool, stop: CauseKind | None = None) -> End:
    """End ``object_id`` with the job's grace; a time limit's stop begun ``warningSeconds`` early
    gives exactly those, so that the program is killed at the limit."""
    policy = record.spec.stop
    warned = stop is CauseKind.TIME_LIMIT and policy.warning_seconds is not None
    grace = policy.warning_seconds if warned else policy.grace_period_seconds
    return End(object_id, orphan=orphan, stop=stop, grace_seconds=grace)


def _stopped_view(stop: StopRequest, view: ObjectView) -> ObjectView:
    """The ended canonical the supervisor stopped, with the stop's cause: what it ended with when
    the stop ended it (or when the deadline's stop met any other failure), and how the stop went."""
    own = view.cause
    deadline = stop.cause.kind is CauseKind.DEADLINE_EXCEEDED
    if own is None or view.cancelled or (deadline and own.kind is not CauseKind.NONE):
        cause = stop.cause.model_copy(update={"stop": view.stop}) if view.stop is not None else stop.cause
        return view.model_copy(update={"cause": cause, "cancelled": False})
    return view


def deadline(record: Record) -> datetime | None:
    """When the job's deadline passes (``spec.deadlineSeconds`` from its submission), if it has one."""
    seconds = record.spec.deadline_seconds
    return None if seconds is None else record.submitted_at + timedelta(seconds=seconds)


_PAST_A_DEADLINE: Final = (Wait, Authorize, Create, RecordCanonical, Release, RecordEnd, RecordRestarts)
"""The steps the deadline replaces once it has come: those that move the job on (an outcome, a
stop and the end of an orphan are left to run)."""


def _with_deadline(record: Record, decision: Decision) -> Decision:
    """``decision`` with the job's deadline: a wait ends at the deadline at the latest, and from
    then on the job's live canonical is stopped, or the job fails with ``deadline-exceeded``."""
    at = deadline(record)
    step = decision.step
    if at is None or not isinstance(step, _PAST_A_DEADLINE):
        return decision
    if record.state.is_outcome or record.cancel is not None:
        return decision
    cur = record.current
    cause = Cause(
        kind=CauseKind.DEADLINE_EXCEEDED,
        detail=f"the job's deadline of {record.spec.deadline_seconds} s passed",
    )
    then: RecordStop | RecordOutcome
    if cur is not None and cur.canonical is not None and cur.cause is None:
        if cur.stop is not None and cur.stop.cause.kind is CauseKind.DEADLINE_EXCEEDED:
            return decision  # stopping at the deadline already
        then = RecordStop(cur.n, cause)
    else:
        then = RecordOutcome(State.FAILED, cause)
    passed = Wait(f"the job's deadline is {format_time(at)}", until=at, then=then)
    if not isinstance(step, Wait) or (step.until is not None and step.until <= at):
        return Decision(step, decision.state, decision.cause, deadline=passed)
    why = f"{step.why}; the job's deadline is {format_time(at)}"
    return Decision(Wait(why, until=at, then=then), decision.state, decision.cause, deadline=passed)


def backoff_seconds(record: Record, index: int) -> float:
    """The wait before rule ``index``'s next firing (its firings so far plus one): 0 without a backoff."""
    rules = record.spec.recovery.rules
    backoff = rules[index].backoff if index < len(rules) else None
    if backoff is None:
        return 0.0
    return backoff.seconds(record.plan.rules[index].firings + 1)


def _backoff_decision(record: Record, cur: Submission) -> Decision:
    """The current submission's recorded end (:class:`RecordEnd`): wait out the backoff of the rule
    that answers it, counted from the time the end was recorded, then authorize the next."""
    ended = cur.cause or NO_CAUSE
    index = resubmitting_rule(record.spec, record.plan, ended)
    if index is None:  # recorded only for a rule that fires: nothing else decides this way
        by = None if record.supervised else SCHEDULER
        return Decision(RecordOutcome(State.FAILED, ended, by), State.FAILED, ended)
    then = Authorize(cur.n + 1, index, ended)
    seconds = backoff_seconds(record, index)
    if cur.ended_at is None or seconds <= 0:
        return Decision(then, State.RECOVERING, ended)
    at = cur.ended_at + timedelta(seconds=seconds)
    firing = record.plan.rules[index].firings + 1
    why = (
        f"next submission at {format_time(at)} (backoff {seconds:g} s before firing {firing} of rule {index})"
    )
    return Decision(Wait(why, until=at, then=then), State.RECOVERING, ended)


def format_time(at: datetime) -> str:
    """``at`` as status shows it: RFC 3339 in UTC, to the second."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def due(decision: Decision, now: datetime) -> Decision:
    """``decision`` at ``now``: a :class:`Wait` whose time has come is the step it waited for (a
    backoff's authorization, a time limit's or the deadline's stop, the deadline's failure). The
    supervisor passes its clock's time; :func:`decide` itself reads none."""
    step = decision.deadline if decision.deadline is not None else decision.step
    if not (isinstance(step, Wait) and step.until is not None and now >= step.until):
        step = decision.step  # (the deadline has not come: the decided step's own wait, if any)
    if isinstance(step, Wait) and step.then is not None and step.until is not None and now >= step.until:
        then = step.then
        if isinstance(then, RecordOutcome):
            return Decision(then, then.state, then.cause)
        return Decision(then, decision.state, decision.cause)
    return decision


def resubmitting_rule(spec: JobSpec, plan: Plan, cause: Cause) -> int | None:
    """The firing test: the index of the rule the supervisor answers an end with ``cause`` by with
    a new submission (its own resubmit rule with something left), or None. The rule is the one
    that covers the cause's kind and, where rules name exit codes, its exit code."""
    index = spec.recovery.rule_for(cause)
    if index is None or index >= len(plan.rules):
        return None
    rule = plan.rules[index]
    if rule.enforcer is Enforcer.SUPERVISOR and rule.action is Action.RESUBMIT and rule.left > 0:
        return index
    return None


def _needed(record: Record, o: ObjectView) -> bool:
    """Whether the record has yet to take in how ``o`` ended: it is (or may become) the canonical
    of the current submission and no outcome is recorded."""
    cur = record.current
    if record.state.is_outcome or cur is None or o.submission != cur.n or cur.cause is not None:
        return False  # (a recorded end: the record has it, through a backoff too)
    return cur.canonical is None or cur.canonical == o.id


def unseen_canonical(record: Record, objects: Sequence[ObjectView]) -> str | None:
    """The current submission's canonical when ``objects`` do not show it and :func:`decide` would
    therefore record it vanished: a cached backend confirms that on the scheduler itself first."""
    cur = record.current
    if record.settled or record.state.is_outcome or record.cancel is not None:
        return None
    if cur is None or cur.canonical is None or cur.cause is not None:
        return None  # (a recorded end needs no listing of its object)
    if any(o.id == cur.canonical for o in objects):
        return None
    return cur.canonical


def _shown(record: Record) -> tuple[State, Cause]:
    """Before the current submission runs: pending for the first, recovering (with why) after."""
    if record.state.is_outcome or record.state in (State.RECOVERING, State.SUSPENDED):
        return record.state, record.cause
    return State.PENDING, NO_CAUSE


# The fields every constructed Submission and Transition sets, shared (pydantic copies a model's set
# before changing it) so that each of the many records kept in memory does not carry its own.
_SUBMISSION_FIELDS: Final = {"n", "authorized_at", "authorized_by", "rule"}
_TRANSITION_FIELDS: Final = {"from_", "to", "submission", "cause", "actor", "time"}


def apply(record: Record, step: Write, *, actor: Actor, now: datetime) -> Record:
    """The record after ``step``, written by ``actor`` at ``now`` (passed in, never read from a clock)."""
    subs = list(record.submissions)
    if isinstance(step, Authorize):
        if step.submission != len(subs) + 1:
            raise ValueError(f"submission {step.submission} does not follow {len(subs)}")
        update: dict[str, object] = {}
        new = Submission.model_construct(
            _SUBMISSION_FIELDS, n=step.submission, authorized_at=now, authorized_by=actor, rule=step.rule
        )
        changes = next_changes(record, step.rule) if step.rule is not None else ()
        if changes:
            new = new.model_copy(update={"changes": changes})
        if subs and step.cause is not None:
            subs[-1] = _ended(subs[-1], step.cause, now, step.started_at)
        subs.append(new)
        update["submissions"] = tuple(subs)
        if step.rule is not None:
            cause = step.cause or NO_CAUSE
            rules = list(record.plan.rules)
            fired = rules[step.rule]
            rules[step.rule] = fired.model_copy(update={"firings": fired.firings + 1})
            update["plan"] = record.plan.model_copy(update={"rules": tuple(rules)})
            update["state"] = State.RECOVERING
            update["cause"] = cause
            update["history"] = (
                *record.history,
                _transition(record.state, State.RECOVERING, step.submission, cause, actor, now),
            )
        return record.model_copy(update=update)
    if isinstance(step, RecordEnd):
        i = step.submission - 1
        if i != len(subs) - 1 or subs[i].cause is not None:
            raise ValueError(f"submission {step.submission} is not the current one with its end unrecorded")
        subs[i] = _ended(subs[i], step.cause, now, step.started_at)
        return record.model_copy(update={"submissions": tuple(subs)})
    if isinstance(step, RecordStop):
        i = step.submission - 1
        if i != len(subs) - 1 or subs[i].cause is not None:
            raise ValueError(f"submission {step.submission} is not the current one with its end unrecorded")
        request = StopRequest(cause=step.cause, actor=actor, time=now)
        subs[i] = subs[i].model_copy(update={"stop": request})
        return record.model_copy(update={"submissions": tuple(subs)})
    if isinstance(step, RecordCanonical):
        i = step.submission - 1
        if subs[i].canonical is not None:
            raise ValueError(f"submission {step.submission} already has canonical {subs[i].canonical}")
        subs[i] = subs[i].model_copy(update={"canonical": step.object_id})
        return record.model_copy(update={"submissions": tuple(subs)})
    if isinstance(step, RecordRestarts):
        i = step.submission - 1
        more = step.restarts - subs[i].restarts
        subs[i] = subs[i].model_copy(update={"restarts": step.restarts})
        rules = [
            r.model_copy(update={"firings": r.firings + more})
            if r.enforcer is Enforcer.SCHEDULER and r.action is Action.RESTART
            else r
            for r in record.plan.rules
        ]
        plan = record.plan.model_copy(update={"rules": tuple(rules)})
        return record.model_copy(update={"submissions": tuple(subs), "plan": plan})
    if isinstance(step, RecordSuspend):
        how = Cause(kind=CauseKind.NONE, detail=f"suspended by {step.actor}")
        if subs and subs[-1].cause is None:
            subs[-1] = _ended(subs[-1], how, now, None)
        n = subs[-1].n if subs else None
        return record.model_copy(
            update={
                "state": State.SUSPENDED,
                "cause": how,
                "submissions": tuple(subs),
                "history": (
                    *record.history,
                    _transition(record.state, State.SUSPENDED, n, how, step.actor, now),
                ),
            }
        )
    if isinstance(step, Resume):
        return _resumed(record, step, now)
    if isinstance(step, RecordOutcome):
        n = subs[-1].n if subs else None  # cancelled before any submission: it concerns none
        if subs and step.state is not State.CANCELLED and subs[-1].cause is None:
            # (a recorded end, whose backoff the deadline cut short, keeps how it ended)
            subs[-1] = _ended(subs[-1], step.cause, now, step.started_at)
        who = step.actor or actor
        return record.model_copy(
            update={
                "state": step.state,
                "cause": step.cause,
                "submissions": tuple(subs),
                "history": (*record.history, _transition(record.state, step.state, n, step.cause, who, now)),
            }
        )
    if step.stop is not None and record.cause.stop is None:
        cause = record.cause.model_copy(update={"stop": step.stop})
        return record.model_copy(update={"settled": True, "settled_at": now, "cause": cause})
    return record.model_copy(update={"settled": True, "settled_at": now})


def _resumed(record: Record, step: Resume, now: datetime) -> Record:
    """``record`` after a person's act authorizes ``step.submission``: recorded ``pending`` again,
    a retry's number taken and the rule it renews with its earlier firings set aside."""
    subs = record.submissions
    if step.submission != len(subs) + 1:
        raise ValueError(f"submission {step.submission} does not follow {len(subs)}")
    new = Submission.model_construct(
        _SUBMISSION_FIELDS, n=step.submission, authorized_at=now, authorized_by=step.actor, rule=None
    )
    update: dict[str, object] = {"state": State.PENDING, "cause": NO_CAUSE, "submissions": (*subs, new)}
    if step.retry is not None:
        words = f"retried by {step.actor}"
        update["retries"] = step.retry
        update["settled"] = False
        update["settled_at"] = None
        if step.fresh_budget is not None and step.fresh_budget < len(record.plan.rules):
            rules = list(record.plan.rules)
            renewed = rules[step.fresh_budget]
            rules[step.fresh_budget] = renewed.model_copy(update={"renewed": renewed.firings})
            update["plan"] = record.plan.model_copy(update={"rules": tuple(rules)})
            words += f", with a fresh budget for rule {step.fresh_budget}"
    else:
        words = f"resumed by {step.actor}"
    why = Cause(kind=CauseKind.NONE, detail=words)
    update["history"] = (
        *record.history,
        _transition(record.state, State.PENDING, step.submission, why, step.actor, now),
    )
    return record.model_copy(update=update)


def _ended(sub: Submission, cause: Cause, now: datetime, started_at: datetime | None) -> Submission:
    """``sub`` with its end recorded: the cause, the time and when it began running, unless a
    backoff's write has them already."""
    update: dict[str, object] = {"cause": cause, "ended_at": sub.ended_at or now}
    if sub.started_at is None and started_at is not None:
        update["started_at"] = started_at
    return sub.model_copy(update=update)


def _transition(
    frm: State, to: State, n: int | None, cause: Cause, actor: Actor, now: datetime
) -> Transition:
    return Transition.model_construct(
        _TRANSITION_FIELDS, from_=frm, to=to, submission=n, cause=cause, actor=actor, time=now
    )


def status(record: Record, objects: Sequence[ObjectView], decision: Decision | None = None) -> Status:
    """What an observer sees: the record joined with the live objects, through :func:`decide`."""
    decision = decision or decide(record, objects)
    by_sub: dict[int, list[ObjectView]] = {}
    for o in objects:
        by_sub.setdefault(o.submission, []).append(o)
    return Status(
        job=record.job,
        state=decision.state,
        cause=decision.cause,
        plan=record.plan,
        submissions=tuple(
            SubmissionStatus(
                n=s.n,
                canonical=s.canonical,
                cause=s.cause,
                objects=tuple(by_sub.get(s.n, ())),
                changes=s.changes,
            )
            for s in record.submissions
        ),
        history=record.history,
        settled=record.settled,
        message=_message(decision),
        cost=recovery_cost(record, objects),
    )


def _message(decision: Decision) -> str:
    if decision.state is State.CANCELLING:
        return "cancelling: waiting for the job's objects to end"
    return describe_step(decision.step)


def describe_step(step: Step) -> str:
    """The step in a user's words (for status messages, events and logs; never a class name)."""
    if isinstance(step, Wait):
        return step.why
    if isinstance(step, Done):
        return "settled: the job has its outcome and every object it created has ended"
    if isinstance(step, Authorize):
        if step.rule is None:
            return f"authorizing submission {step.submission}"
        why = f" after cause {_cause_words(step.cause)}" if step.cause is not None else ""
        return f"rule {step.rule} fired{why}: authorizing submission {step.submission}"
    if isinstance(step, Create):
        return f"creating the object of submission {step.submission}, held back"
    if isinstance(step, RecordCanonical):
        return f"recording object {step.object_id} as the one of submission {step.submission}"
    if isinstance(step, Release):
        return f"releasing object {step.object_id} to the scheduler"
    if isinstance(step, End):
        if step.stop is not None:
            return (
                f"stopping object {step.object_id} with cause {step.stop}: SIGTERM, then SIGKILL "
                "after its grace period"
            )
        if step.orphan:
            return f"ending object {step.object_id}: it is not the one recorded for its submission"
        return f"ending object {step.object_id}: the job has its outcome"
    if isinstance(step, RecordEnd):
        return (
            f"rule {step.rule} fires after cause {step.cause.kind} once its backoff has passed: "
            f"recording the end of submission {step.submission}"
        )
    if isinstance(step, RecordStop):
        return f"recording the stop of submission {step.submission} with cause {step.cause.kind}"
    if isinstance(step, RecordRestarts):
        return (
            f"recording that the scheduler restarted submission {step.submission} in place "
            f"({step.restarts} time{'s' if step.restarts != 1 else ''})"
        )
    if isinstance(step, RecordOutcome):
        return _outcome_words(step)
    if isinstance(step, RecordSuspend):
        return f"suspended by {step.actor}: recording it, then ending the running submission"
    if isinstance(step, Resume):
        act = f"retry {step.retry} by {step.actor}" if step.retry is not None else f"resumed by {step.actor}"
        fresh = f" with a fresh budget for rule {step.fresh_budget}" if step.fresh_budget is not None else ""
        return f"{act}{fresh}: authorizing submission {step.submission}"
    return "every object has ended: recording the job settled"


def _cause_words(cause: Cause) -> str:
    return cause_words(cause.kind.value, cause.exit_code, cause.signal)


def _outcome_words(step: RecordOutcome) -> str:
    cause = step.cause
    if step.state is State.CANCELLED:
        return cause.detail or "cancelled"
    if step.state is State.SUCCEEDED:
        return "succeeded"
    detail = f" ({cause.detail})" if cause.detail else ""
    return f"failed with cause {_cause_words(cause)}{detail}"

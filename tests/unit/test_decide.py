"""The decision function for every step of the protocol, apply() for every write, and the memory
backend's cause classification (including native restarts under scheduler-enforced rules)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from dispatch import (
    Action,
    Actor,
    ActorKind,
    Cause,
    CauseKind,
    Enforcer,
    InvalidTransition,
    JobSpec,
    MemoryBackend,
    MemoryStore,
    ObjectView,
    Phase,
    Record,
    RecoveryPolicy,
    Rule,
    Shape,
    State,
    Supervisor,
    decide,
    make_plan,
    status,
)
from dispatch._backends.memory._adapter import CAPABILITIES
from dispatch._decide import (
    CANCELLED_OUTSIDE,
    Authorize,
    Create,
    Done,
    End,
    RecordCanonical,
    RecordOutcome,
    RecordRestarts,
    RecordSettled,
    Release,
    Wait,
    apply,
    unseen_canonical,
)
from dispatch._errors import TransientBackendError
from dispatch._model import NO_CAUSE, SCHEDULER, SUPERVISOR, CancelRequest
from tests.support.records import PREEMPT_TWICE, T0, new_record, started, step

BOB = Actor(kind=ActorKind.HUMAN, id="bob")
PREEMPTED = Cause(kind=CauseKind.PREEMPTED, detail="preempted")
NODE_LOST = Cause(kind=CauseKind.NODE_LOST, detail="node")
OOM = Cause(kind=CauseKind.OUT_OF_MEMORY, exit_code=137)
SUCCESS = Cause(kind=CauseKind.NONE)


def obj(
    id: str,
    n: int,
    phase: Phase,
    cause: Cause | None = None,
    *,
    cancelled: bool = False,
    restarts: int = 0,
    job: str = "job",
) -> ObjectView:
    return ObjectView(
        id=id, job=job, submission=n, phase=phase, cause=cause, cancelled=cancelled, restarts=restarts
    )


# 1. authorize the first submission


def test_a_new_record_authorizes_submission_1() -> None:
    d = decide(new_record(PREEMPT_TWICE), [])
    assert d.step == Authorize(1)
    assert (d.state, d.cause) == (State.PENDING, NO_CAUSE)


# 2. create


def test_an_authorized_submission_without_objects_creates_one() -> None:
    d = decide(step(new_record(PREEMPT_TWICE), Authorize(1)), [])
    assert d.step == Create(1)
    assert d.state is State.PENDING


# 3. record canonical, choosing among candidates


def test_the_only_candidate_is_recorded_canonical() -> None:
    r = step(new_record(PREEMPT_TWICE), Authorize(1))
    d = decide(r, [obj("7", 1, Phase.HELD)])
    assert d.step == RecordCanonical(1, "7")
    assert d.state is State.PENDING


def test_candidate_choice_is_deterministic_live_first_then_by_id() -> None:
    r = step(new_record(PREEMPT_TWICE), Authorize(1))
    objects = [
        obj("c", 1, Phase.HELD),
        obj("a", 1, Phase.ENDED, SUCCESS, cancelled=True),
        obj("b", 1, Phase.HELD),
    ]
    assert decide(r, objects).step == RecordCanonical(1, "b")
    assert decide(r, list(reversed(objects))).step == RecordCanonical(1, "b")
    # only ended candidates: the smallest id
    assert decide(r, [obj("z", 1, Phase.ENDED, SUCCESS), obj("y", 1, Phase.ENDED, SUCCESS)]).step == (
        RecordCanonical(1, "y")
    )


def test_numbered_ids_are_chosen_in_number_order() -> None:
    # Slurm numbers its jobs: "999" was created before "1000" (a job planted later with a copied
    # tag must not win by sorting first as text).
    r = step(new_record(PREEMPT_TWICE), Authorize(1))
    objects = [obj("1000", 1, Phase.HELD), obj("999", 1, Phase.HELD)]
    assert decide(r, objects).step == RecordCanonical(1, "999")
    assert decide(r, list(reversed(objects))).step == RecordCanonical(1, "999")


def test_candidates_are_not_orphans_while_a_canonical_is_being_chosen() -> None:
    r = step(new_record(PREEMPT_TWICE), Authorize(1))
    d = decide(r, [obj("2", 1, Phase.HELD), obj("1", 1, Phase.HELD)])
    assert not isinstance(d.step, End)


# 4. release


def test_a_held_canonical_is_released() -> None:
    d = decide(started(PREEMPT_TWICE), [obj("1", 1, Phase.HELD)])
    assert d.step == Release("1")
    assert d.state is State.PENDING


# 5. wait while queued or running, and what status shows


def test_queued_waits_and_shows_pending() -> None:
    d = decide(started(PREEMPT_TWICE), [obj("1", 1, Phase.QUEUED)])
    assert isinstance(d.step, Wait)
    assert d.step.why == "queued on the scheduler"
    assert (d.state, d.cause) == (State.PENDING, NO_CAUSE)


def test_running_waits_and_shows_running() -> None:
    d = decide(started(PREEMPT_TWICE), [obj("1", 1, Phase.RUNNING)])
    assert isinstance(d.step, Wait)
    assert (d.state, d.cause) == (State.RUNNING, NO_CAUSE)


def test_a_recovering_job_shows_recovering_with_its_cause_until_it_runs() -> None:
    r = step(started(PREEMPT_TWICE), Authorize(2, 0, PREEMPTED))
    assert (r.state, r.cause) == (State.RECOVERING, PREEMPTED)
    ended = obj("1", 1, Phase.ENDED, PREEMPTED)
    d = decide(r, [ended])
    assert d.step == Create(2)
    assert (d.state, d.cause) == (State.RECOVERING, PREEMPTED)
    r = step(r, RecordCanonical(2, "2"))
    for phase, want in [(Phase.HELD, Release("2")), (Phase.QUEUED, None)]:
        d = decide(r, [ended, obj("2", 2, phase)])
        if want is not None:
            assert d.step == want
        assert (d.state, d.cause) == (State.RECOVERING, PREEMPTED)
    d = decide(r, [ended, obj("2", 2, Phase.RUNNING)])
    assert (d.state, d.cause) == (State.RUNNING, NO_CAUSE)


# 5. the canonical ended: recover within budget, else fail


def test_a_covered_cause_with_budget_left_authorizes_the_next_submission() -> None:
    d = decide(started(PREEMPT_TWICE), [obj("1", 1, Phase.ENDED, PREEMPTED)])
    assert d.step == Authorize(2, 0, PREEMPTED)
    assert (d.state, d.cause) == (State.RECOVERING, PREEMPTED)


def test_the_rule_that_covers_the_cause_fires() -> None:
    rules = (Rule(on=(CauseKind.TIME_LIMIT,), budget=1), Rule(on=(CauseKind.OUT_OF_MEMORY,), budget=1))
    d = decide(started(*rules), [obj("1", 1, Phase.ENDED, OOM)])
    assert d.step == Authorize(2, 1, OOM)


def test_recovering_twice_then_budget_exhausted_fails() -> None:
    r = started(PREEMPT_TWICE)
    for n in (1, 2):
        d = decide(r, [obj(str(n), n, Phase.ENDED, PREEMPTED)])
        assert d.step == Authorize(n + 1, 0, PREEMPTED)
        assert d.state is State.RECOVERING
        r = step(r, d.step, RecordCanonical(n + 1, str(n + 1)))
    assert r.plan.rules[0].firings == 2
    assert [(t.from_, t.to, t.submission) for t in r.history] == [
        (State.PENDING, State.RECOVERING, 2),
        (State.RECOVERING, State.RECOVERING, 3),
    ]
    d = decide(r, [obj("3", 3, Phase.ENDED, PREEMPTED)])
    assert d.step == RecordOutcome(State.FAILED, PREEMPTED)
    assert (d.state, d.cause) == (State.FAILED, PREEMPTED)


def test_a_zero_budget_rule_never_fires() -> None:
    r = started(Rule(on=(CauseKind.PREEMPTED,), budget=0))
    assert decide(r, [obj("1", 1, Phase.ENDED, PREEMPTED)]).step == RecordOutcome(State.FAILED, PREEMPTED)


@pytest.mark.parametrize("kind", [c for c in CauseKind if c not in (CauseKind.PREEMPTED, CauseKind.NONE)])
def test_an_uncovered_cause_fails_with_that_cause(kind: CauseKind) -> None:
    cause = Cause(kind=kind, detail="x")
    d = decide(started(PREEMPT_TWICE), [obj("1", 1, Phase.ENDED, cause)])
    assert d.step == RecordOutcome(State.FAILED, cause)
    assert (d.state, d.cause) == (State.FAILED, cause)


def test_a_scheduler_enforced_rule_is_not_fired_by_the_supervisor() -> None:
    native = Rule(on=(CauseKind.NON_ZERO_EXIT, CauseKind.OUT_OF_MEMORY), action=Action.RESTART, budget=5)
    r = started(native, capabilities=CAPABILITIES[Shape.KUBEFLOW])
    assert r.plan.rules[0].enforcer is Enforcer.SCHEDULER
    d = decide(r, [obj("1", 1, Phase.ENDED, OOM, restarts=0)])
    assert d.step == RecordOutcome(State.FAILED, OOM)


def test_an_ended_canonical_without_a_cause_is_unknown() -> None:
    d = decide(started(PREEMPT_TWICE), [obj("1", 1, Phase.ENDED)])
    assert isinstance(d.step, RecordOutcome)
    assert d.step.cause.kind is CauseKind.UNKNOWN


# success


def test_success_records_succeeded() -> None:
    d = decide(started(PREEMPT_TWICE), [obj("1", 1, Phase.ENDED, SUCCESS)])
    assert d.step == RecordOutcome(State.SUCCEEDED, SUCCESS)
    assert d.state is State.SUCCEEDED


# cancel


@pytest.mark.parametrize("phase", [Phase.HELD, Phase.QUEUED, Phase.RUNNING])
def test_a_cancel_request_records_cancelled_by_the_requester(phase: Phase) -> None:
    r = started(PREEMPT_TWICE).model_copy(update={"cancel": CancelRequest(actor=BOB, time=T0)})
    d = decide(r, [obj("1", 1, phase)])
    assert isinstance(d.step, RecordOutcome)
    assert d.step.state is State.CANCELLED
    assert d.step.actor == BOB
    assert d.step.cause.kind is CauseKind.NONE
    assert "human:bob" in d.step.cause.detail
    assert d.state is State.CANCELLING  # its object is alive: not cancelled yet
    assert status(r, [obj("1", 1, phase)]).message.startswith("cancelling")
    assert not status(r, [obj("1", 1, phase)]).settled
    after = apply(r, d.step, actor=SUPERVISOR, now=T0)
    assert after.state is State.CANCELLED
    assert after.history[-1].actor == BOB
    assert (after.history[-1].from_, after.history[-1].to) == (State.PENDING, State.CANCELLED)


def test_a_cancel_before_anything_was_authorized() -> None:
    r = new_record(PREEMPT_TWICE).model_copy(update={"cancel": CancelRequest(actor=BOB, time=T0)})
    d = decide(r, [])
    assert isinstance(d.step, RecordOutcome)
    assert d.step.state is State.CANCELLED
    assert d.state is State.CANCELLED  # nothing was ever created: nothing to wait for
    r = apply(r, d.step, actor=SUPERVISOR, now=T0)
    assert (r.history[-1].from_, r.history[-1].to) == (State.PENDING, State.CANCELLED)
    assert r.history[-1].submission is None  # it concerns no submission: never a submission 0
    assert Record.model_validate(r.model_dump(mode="json", by_alias=True)) == r
    assert decide(r, []).step == RecordSettled()


def test_a_cancel_ends_candidates_as_orphans_first() -> None:
    r = step(new_record(PREEMPT_TWICE), Authorize(1))
    r = r.model_copy(update={"cancel": CancelRequest(actor=BOB, time=T0)})
    assert decide(r, [obj("1", 1, Phase.HELD)]).step == End("1", orphan=True)


# outcome -> end live objects -> settled -> done


def test_after_an_outcome_live_objects_are_ended_then_the_job_settles() -> None:
    r = started(PREEMPT_TWICE).model_copy(update={"cancel": CancelRequest(actor=BOB, time=T0)})
    r = apply(r, decide(r, []).step, actor=SUPERVISOR, now=T0)  # type: ignore[arg-type]
    d = decide(r, [obj("1", 1, Phase.RUNNING)])
    assert d.step == End("1", orphan=False)
    assert d.state is State.CANCELLING
    d = decide(r, [obj("1", 1, Phase.ENDED, SUCCESS, cancelled=True)])
    assert d.step == RecordSettled()
    assert d.state is State.CANCELLED
    r = apply(r, RecordSettled(), actor=SUPERVISOR, now=T0)
    assert r.settled
    d = decide(r, [obj("1", 1, Phase.ENDED, SUCCESS, cancelled=True)])
    assert d.step == Done()
    assert d.state is State.CANCELLED


def test_an_object_created_after_the_job_settled_is_ended() -> None:
    """A slow supervisor performed a Create it had decided before the job settled."""
    r = step(started(PREEMPT_TWICE), RecordOutcome(State.SUCCEEDED, SUCCESS), RecordSettled())
    late = obj("9", 1, Phase.HELD)
    d = decide(r, [obj("1", 1, Phase.ENDED, SUCCESS), late])
    assert d.step == End("9", orphan=True)
    assert (d.state, d.cause) == (State.SUCCEEDED, SUCCESS)


async def test_a_slow_creator_cleans_up_after_a_settled_job() -> None:
    backend = MemoryBackend(Shape.SLURM)
    store = MemoryStore()
    await store.create(new_record(PREEMPT_TWICE))
    slow, other = Supervisor(backend, store), Supervisor(backend, store)
    await slow.step("job")  # authorize 1
    intent = await slow.prepare("job")
    assert intent.decision.step == Create(1)
    record, version = await store.get("job")
    await store.put(record.model_copy(update={"cancel": CancelRequest(actor=BOB, time=T0)}), version)
    assert isinstance((await other.drive("job")).step, Done)
    await slow.perform(intent)  # the stale Create lands after the job settled...
    # ...and its creator, re-reading the record right after, ends what it made at once
    assert [o.phase for o in await backend.list("job")] == [Phase.ENDED]
    assert backend.objects()[0].cancelled
    assert not backend.ever_released(backend.objects()[0].id)
    assert isinstance((await slow.drive("job")).step, Done)


async def test_a_late_object_whose_creator_died_is_ended_by_the_next_step() -> None:
    """The one case invariant 5 allows: held, never released, ended by anyone's next step."""
    backend = MemoryBackend(Shape.SLURM)
    store = MemoryStore()
    await store.create(new_record(PREEMPT_TWICE))
    slow, other = Supervisor(backend, store), Supervisor(backend, store)
    await slow.step("job")
    intent = await slow.prepare("job")
    record, version = await store.get("job")
    await store.put(record.model_copy(update={"cancel": CancelRequest(actor=BOB, time=T0)}), version)
    await other.drive("job")
    # the creator's create lands, and it dies before re-reading the record
    await backend.create("job", 1, intent.record.spec, intent.record.plan)
    assert [o.phase for o in await backend.list("job")] == [Phase.HELD]
    assert isinstance((await other.drive("job")).step, Done)
    assert [o.phase for o in await backend.list("job")] == [Phase.ENDED]


async def test_settling_takes_a_fresh_listing() -> None:
    """A create that lands between the settle decision's listing and its write stops the settle."""
    backend = MemoryBackend(Shape.SLURM)
    store = MemoryStore()
    r = step(new_record(PREEMPT_TWICE), Authorize(1))
    r = r.model_copy(update={"cancel": CancelRequest(actor=BOB, time=T0)})
    await store.create(r)
    sup = Supervisor(backend, store)
    await sup.step("job")  # records cancelled (submission 1 has no object yet)
    intent = await sup.prepare("job")
    assert intent.decision.step == RecordSettled()
    await backend.create("job", 1, r.spec, r.plan)  # a late create, after the decision's listing
    await sup.perform(intent)
    assert not (await store.get("job")).record.settled
    assert isinstance((await sup.drive("job")).step, Done)
    assert all(o.phase is Phase.ENDED for o in await backend.list("job"))


def test_a_succeeded_job_settles() -> None:
    r = step(started(PREEMPT_TWICE), RecordOutcome(State.SUCCEEDED, SUCCESS))
    assert decide(r, [obj("1", 1, Phase.ENDED, SUCCESS)]).step == RecordSettled()


def test_a_job_does_not_settle_while_an_ended_object_still_terminates() -> None:
    """Settled means every process has stopped: a pod in its termination grace period still runs."""
    r = step(started(PREEMPT_TWICE), RecordOutcome(State.SUCCEEDED, SUCCESS))
    still = obj("1", 1, Phase.ENDED, SUCCESS).model_copy(update={"terminating": True})
    d = decide(r, [still])
    assert isinstance(d.step, Wait)
    assert d.state is State.SUCCEEDED


# orphans


def test_a_second_object_of_a_submission_with_a_canonical_is_an_orphan() -> None:
    d = decide(started(PREEMPT_TWICE), [obj("1", 1, Phase.RUNNING), obj("2", 1, Phase.HELD)])
    assert d.step == End("2", orphan=True)
    assert d.state is State.PENDING  # what status shows is unaffected by orphan cleanup


def test_a_non_canonical_object_of_an_older_submission_is_an_orphan() -> None:
    r = step(started(PREEMPT_TWICE), Authorize(2, 0, PREEMPTED), RecordCanonical(2, "3"))
    objects = [obj("1", 1, Phase.ENDED, PREEMPTED), obj("2", 1, Phase.HELD), obj("3", 2, Phase.RUNNING)]
    d = decide(r, objects)
    assert d.step == End("2", orphan=True)
    assert (d.state, d.cause) == (State.RECOVERING, PREEMPTED)


def test_ended_orphans_are_left_alone() -> None:
    d = decide(started(PREEMPT_TWICE), [obj("1", 1, Phase.RUNNING), obj("2", 1, Phase.ENDED, SUCCESS)])
    assert isinstance(d.step, Wait)


def test_objects_of_a_submission_newer_than_the_record_are_left_alone() -> None:
    # A supervisor read the record, then another authorized submission 2 and created its object.
    r = started(PREEMPT_TWICE)
    d = decide(r, [obj("1", 1, Phase.ENDED, PREEMPTED), obj("2", 2, Phase.HELD)])
    assert d.step == Authorize(2, 0, PREEMPTED)
    r0 = new_record(PREEMPT_TWICE)
    assert decide(r0, [obj("1", 1, Phase.HELD)]).step == Authorize(1)


# the canonical vanished, or was cancelled outside dispatch


def test_a_vanished_canonical_ends_with_cause_unknown() -> None:
    d = decide(started(PREEMPT_TWICE), [])
    assert isinstance(d.step, RecordOutcome)
    assert d.step.state is State.FAILED
    assert d.step.cause.kind is CauseKind.UNKNOWN
    assert "no longer shows" in d.step.cause.detail


def test_a_vanished_canonical_is_recovered_when_unknown_is_covered() -> None:
    d = decide(started(Rule(on=(CauseKind.UNKNOWN,), budget=1)), [])
    assert isinstance(d.step, Authorize)
    assert (d.step.submission, d.step.rule) == (2, 0)
    assert d.state is State.RECOVERING
    assert d.cause.kind is CauseKind.UNKNOWN


def retained(id: str, n: int, cause: Cause = SUCCESS) -> ObjectView:
    """Deleted by someone else, still readable thanks to dispatch's finalizer."""
    return obj(id, n, Phase.ENDED, cause, cancelled=True).model_copy(update={"retained": True})


def test_a_retained_canonical_is_read_before_it_is_let_go() -> None:
    """Deleted while no supervisor ran: the same record as a deletion seen live, then ended."""
    r = started(PREEMPT_TWICE)
    d = decide(r, [retained("1", 1)])
    assert isinstance(d.step, RecordOutcome)
    assert d.step.state is State.CANCELLED
    assert d.step.cause.detail == CANCELLED_OUTSIDE
    after = apply(r, d.step, actor=SUPERVISOR, now=T0)
    assert decide(after, [retained("1", 1)]).step == End("1", orphan=False)
    assert isinstance(decide(after, []).step, RecordSettled)


def test_a_retained_candidate_is_kept_while_the_canonical_is_chosen() -> None:
    r = step(new_record(PREEMPT_TWICE), Authorize(1))
    assert decide(r, [retained("1", 1)]).step == RecordCanonical(1, "1")


def test_retained_objects_the_record_no_longer_needs_are_let_go() -> None:
    # an older submission's object, deleted after the job moved on
    r = step(started(PREEMPT_TWICE), Authorize(2, 0, PREEMPTED), RecordCanonical(2, "2"))
    d = decide(r, [retained("1", 1, PREEMPTED), obj("2", 2, Phase.RUNNING)])
    assert d.step == End("1", orphan=False)
    # a settled job
    settled = step(r, RecordOutcome(State.SUCCEEDED, SUCCESS), RecordSettled())
    assert decide(settled, [retained("2", 2)]).step == End("2", orphan=False)


def test_a_missing_canonical_is_confirmed_only_while_the_record_needs_it() -> None:
    r = started(PREEMPT_TWICE)
    assert unseen_canonical(r, []) == "1"
    assert unseen_canonical(r, [obj("1", 1, Phase.RUNNING)]) is None
    assert unseen_canonical(new_record(PREEMPT_TWICE), []) is None
    assert unseen_canonical(step(new_record(PREEMPT_TWICE), Authorize(1)), []) is None
    done = step(r, RecordOutcome(State.SUCCEEDED, SUCCESS))
    assert unseen_canonical(done, []) is None


class _LaggingBackend(MemoryBackend):
    """A memory backend whose listing misses one object until it is confirmed (a watch cache
    behind another process's create): the protocol a cached backend implements."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden: str | None = None
        self.confirmed: list[str] = []

    async def list(self, job: str) -> Sequence[ObjectView]:
        return [o for o in await super().list(job) if o.id != self.hidden]

    async def confirm(self, job: str, object_id: str) -> Sequence[ObjectView]:
        self.confirmed.append(object_id)
        self.hidden = None
        return await super().list(job)


async def test_the_supervisor_confirms_a_canonical_its_backend_does_not_show() -> None:
    backend, store = _LaggingBackend(), MemoryStore()
    await store.create(new_record(PREEMPT_TWICE))
    sup = Supervisor(backend, store)
    await sup.drive("job")  # authorized, created, recorded canonical, released
    (canonical,) = [o.id for o in await backend.list("job")]
    backend.hidden = canonical
    decision = await sup.step("job")
    assert backend.confirmed == [canonical]
    assert decision.step == Wait("queued on the scheduler")
    assert (await store.get("job")).record.state is State.PENDING
    # without the confirmation the cache's word would have failed the job
    backend.hidden = canonical
    record, _ = await store.get("job")
    blind = decide(record, await backend.list("job")).step
    assert isinstance(blind, RecordOutcome)
    assert blind.state is State.FAILED


class _StoppingBackend(MemoryBackend):
    """A memory backend with a write in flight that makes its objects ended (a kit's stop): it
    refuses to quiesce until the write lands."""

    def __init__(self) -> None:
        super().__init__(auto_run=True)
        self.landed = False
        self.asked: list[str] = []

    async def quiesce(self, job: str) -> None:
        self.asked.append(job)
        if not self.landed:
            raise TransientBackendError("stop in flight")


async def test_the_supervisor_quiesces_its_backend_before_recording_settled_and_only_then() -> None:
    backend, store = _StoppingBackend(), MemoryStore()
    await store.create(new_record(PREEMPT_TWICE))
    sup = Supervisor(backend, store)
    await sup.drive("job")  # authorized, created, recorded canonical, released, running
    assert backend.asked == []  # no other step waits for it
    (canonical,) = await backend.list("job")
    backend.env.complete(canonical.id)
    with pytest.raises(TransientBackendError):
        await sup.drive("job")  # the outcome is recorded; settling waits
    record = (await store.get("job")).record
    assert (record.state, record.settled) == (State.SUCCEEDED, False)
    assert backend.asked == ["job"]
    backend.landed = True
    assert isinstance((await sup.drive("job")).step, Done)
    assert (await store.get("job")).record.settled


def test_an_external_cancel_is_recorded_as_cancelled_by_the_scheduler() -> None:
    d = decide(started(PREEMPT_TWICE), [obj("1", 1, Phase.ENDED, SUCCESS, cancelled=True)])
    assert isinstance(d.step, RecordOutcome)
    assert d.step.state is State.CANCELLED
    assert d.step.actor == SCHEDULER
    assert d.step.cause.detail == CANCELLED_OUTSIDE
    after = apply(started(PREEMPT_TWICE), d.step, actor=SUPERVISOR, now=T0)
    assert after.history[-1].actor == SCHEDULER


# scheduler restarts in place


def test_scheduler_restarts_are_recorded_and_counted_as_firings() -> None:
    native = Rule(on=(CauseKind.NON_ZERO_EXIT, CauseKind.OUT_OF_MEMORY), action=Action.RESTART, budget=3)
    r = started(native, Rule(on=(CauseKind.PREEMPTED,), budget=1), capabilities=CAPABILITIES[Shape.KUBEFLOW])
    assert [p.enforcer for p in r.plan.rules] == [Enforcer.SCHEDULER, Enforcer.SUPERVISOR]
    d = decide(r, [obj("1", 1, Phase.RUNNING, restarts=2)])
    assert d.step == RecordRestarts(1, 2)
    assert d.state is State.RUNNING
    d2 = decide(r, [obj("1", 1, Phase.QUEUED, restarts=2)])
    assert d2.state is State.PENDING
    r = apply(r, d.step, actor=SUPERVISOR, now=T0)
    assert r.submissions[0].restarts == 2
    assert [p.firings for p in r.plan.rules] == [2, 0]
    assert r.history == ()  # restarts in place are not transitions
    assert isinstance(decide(r, [obj("1", 1, Phase.RUNNING, restarts=2)]).step, Wait)
    r = apply(r, RecordRestarts(1, 3), actor=SUPERVISOR, now=T0)
    assert r.plan.rules[0].firings == 3


@pytest.mark.parametrize(
    ("cause", "shown"),
    [(SUCCESS, State.SUCCEEDED), (Cause(kind=CauseKind.NON_ZERO_EXIT, exit_code=1), State.FAILED)],
)
def test_unrecorded_restarts_of_an_ended_canonical_show_its_outcome(cause: Cause, shown: State) -> None:
    """Found by the state machine: an unsupervised job whose pod the scheduler restarted, then ended,
    showed pending until someone recorded the restarts, so a watch of it never ended."""
    native = Rule(on=(CauseKind.NON_ZERO_EXIT, CauseKind.OUT_OF_MEMORY), action=Action.RESTART, budget=1)
    r = step(
        new_record(native, capabilities=CAPABILITIES[Shape.KUBEFLOW], supervised=False),
        Authorize(1),
        RecordCanonical(1, "1"),
    )
    d = decide(r, [obj("1", 1, Phase.ENDED, cause, restarts=1)])
    assert d.step == RecordRestarts(1, 1)
    assert (d.state, d.cause) == (shown, cause)
    after = decide(apply(r, d.step, actor=SCHEDULER, now=T0), [obj("1", 1, Phase.ENDED, cause, restarts=1)])
    assert isinstance(after.step, RecordOutcome)
    assert (after.state, after.cause) == (d.state, d.cause)  # recording the restarts changes nothing shown


# apply() for each write


def test_apply_authorize_1() -> None:
    r = apply(new_record(PREEMPT_TWICE), Authorize(1), actor=SUPERVISOR, now=T0)
    (s,) = r.submissions
    assert (s.n, s.authorized_at, s.authorized_by, s.rule, s.canonical) == (1, T0, SUPERVISOR, None, None)
    assert r.state is State.PENDING
    assert r.history == ()
    assert r.plan.rules[0].firings == 0


def test_apply_authorize_n_counts_the_firing_in_the_same_write() -> None:
    r = apply(started(PREEMPT_TWICE), Authorize(2, 0, PREEMPTED), actor=SUPERVISOR, now=T0)
    assert [s.n for s in r.submissions] == [1, 2]
    assert r.submissions[0].cause == PREEMPTED
    assert r.submissions[1].rule == 0
    assert r.plan.rules[0].firings == 1
    assert (r.state, r.cause) == (State.RECOVERING, PREEMPTED)
    (t,) = r.history
    assert (t.from_, t.to, t.submission, t.cause, t.actor, t.time) == (
        State.PENDING,
        State.RECOVERING,
        2,
        PREEMPTED,
        SUPERVISOR,
        T0,
    )


@pytest.mark.parametrize("n", [1, 3, 4])
def test_apply_authorize_refuses_a_gap_or_a_repeat(n: int) -> None:
    with pytest.raises(ValueError, match="does not follow 1"):
        apply(started(PREEMPT_TWICE), Authorize(n, 0, PREEMPTED), actor=SUPERVISOR, now=T0)


def test_apply_record_canonical_and_refuse_a_second() -> None:
    r = step(new_record(PREEMPT_TWICE), Authorize(1))
    r = apply(r, RecordCanonical(1, "x"), actor=SUPERVISOR, now=T0)
    assert r.submissions[0].canonical == "x"
    with pytest.raises(ValueError, match="already has canonical x"):
        apply(r, RecordCanonical(1, "y"), actor=SUPERVISOR, now=T0)


def test_apply_record_outcome() -> None:
    r = apply(started(PREEMPT_TWICE), RecordOutcome(State.FAILED, OOM), actor=SUPERVISOR, now=T0)
    assert (r.state, r.cause) == (State.FAILED, OOM)
    assert r.submissions[0].cause == OOM
    assert [(t.from_, t.to, t.submission, t.actor) for t in r.history] == [
        (State.PENDING, State.FAILED, 1, SUPERVISOR)
    ]
    r = apply(started(PREEMPT_TWICE), RecordOutcome(State.CANCELLED, SUCCESS, BOB), actor=SUPERVISOR, now=T0)
    assert r.submissions[0].cause is None  # a cancelled submission has no cause of its own
    assert r.history[-1].actor == BOB


def test_apply_record_settled() -> None:
    r = step(started(PREEMPT_TWICE), RecordOutcome(State.SUCCEEDED, SUCCESS), RecordSettled())
    assert r.settled
    assert r.state is State.SUCCEEDED


def test_apply_never_changes_its_input() -> None:
    r = started(PREEMPT_TWICE)
    before = r.model_dump()
    apply(r, Authorize(2, 0, PREEMPTED), actor=SUPERVISOR, now=T0)
    assert r.model_dump() == before


def test_records_built_by_apply_validate() -> None:
    r = step(
        started(PREEMPT_TWICE),
        Authorize(2, 0, PREEMPTED),
        RecordCanonical(2, "2"),
        RecordOutcome(State.SUCCEEDED, SUCCESS),
        RecordSettled(),
    )
    assert Record.model_validate(r.model_dump()) == r


# status joins the record with the live objects through decide


def test_status_joins_the_record_and_the_objects() -> None:
    r = step(started(PREEMPT_TWICE), Authorize(2, 0, PREEMPTED))
    objects = [obj("1", 1, Phase.ENDED, PREEMPTED)]
    s = status(r, objects)
    assert (s.state, s.cause) == (State.RECOVERING, PREEMPTED)
    assert [(x.n, x.canonical, [o.id for o in x.objects]) for x in s.submissions] == [
        (1, "1", ["1"]),
        (2, None, []),
    ]
    assert s.message == "creating the object of submission 2, held back"
    assert not s.settled
    assert status(started(PREEMPT_TWICE), [obj("1", 1, Phase.RUNNING)]).message == "running"


# cause classification in the memory backend


async def _running(backend: MemoryBackend, rules: tuple[Rule, ...] = ()) -> str:
    spec = JobSpec(name="job", command=("train",), recovery=RecoveryPolicy(rules=rules))
    plan = make_plan("job", spec, backend.capabilities, supervised=True)
    object_id = await backend.create("job", 1, spec, plan)
    await backend.release(object_id)
    if not backend.auto_run:
        backend.env.run(object_id)
    return object_id


async def _view(backend: MemoryBackend, object_id: str) -> ObjectView:
    (view,) = [o for o in await backend.list("job") if o.id == object_id]
    return view


@pytest.mark.parametrize("shape", list(Shape))
@pytest.mark.parametrize(
    ("event", "kind", "exit_code"),
    [
        ("complete", CauseKind.NONE, None),
        ("preempt", CauseKind.PREEMPTED, None),
        ("lose_node", CauseKind.NODE_LOST, None),
        ("out_of_memory", CauseKind.OUT_OF_MEMORY, 137),
        ("time_limit", CauseKind.TIME_LIMIT, None),
        ("exit0", CauseKind.NONE, None),
        ("exit3", CauseKind.NON_ZERO_EXIT, 3),
        ("fail_launch", CauseKind.LAUNCH_FAILED, None),
        ("requeue", CauseKind.REQUEUED, None),
    ],
)
async def test_env_classifies_causes(
    shape: Shape, event: str, kind: CauseKind, exit_code: int | None
) -> None:
    backend = MemoryBackend(shape)
    object_id = await _running(backend)
    env = backend.env
    if event == "exit0":
        env.exit(object_id, 0)
    elif event == "exit3":
        env.exit(object_id, 3)
    else:
        getattr(env, event)(object_id)
    view = await _view(backend, object_id)
    assert view.phase is Phase.ENDED
    assert view.cause is not None
    assert view.cause.kind is kind
    assert view.cause.exit_code == exit_code
    assert not view.cancelled


@pytest.mark.parametrize("shape", list(Shape))
async def test_env_classifies_queued_only_causes(shape: Shape) -> None:
    backend = MemoryBackend(shape)
    for n, (event, kind) in enumerate(
        [("no_capacity", CauseKind.NO_CAPACITY), ("fail_launch", CauseKind.LAUNCH_FAILED)]
    ):
        spec = JobSpec(name="job", command=("train",))
        object_id = await backend.create(
            "job", n + 1, spec, make_plan("job", spec, backend.capabilities, supervised=True)
        )
        await backend.release(object_id)
        assert (await _view(backend, object_id)).phase is Phase.QUEUED
        getattr(backend.env, event)(object_id)
        view = await _view(backend, object_id)
        assert view.cause is not None
        assert view.cause.kind is kind


async def test_env_refuses_impossible_transitions() -> None:
    backend = MemoryBackend(Shape.SLURM)
    spec = JobSpec(name="job", command=("train",))
    object_id = await backend.create(
        "job", 1, spec, make_plan("job", spec, backend.capabilities, supervised=True)
    )
    with pytest.raises(InvalidTransition):
        backend.env.run(object_id)  # held: not released
    with pytest.raises(InvalidTransition):
        backend.env.preempt(object_id)
    with pytest.raises(InvalidTransition):
        backend.env.no_capacity(object_id)
    with pytest.raises(InvalidTransition):
        backend.env.complete("nope")
    await backend.release(object_id)
    with pytest.raises(InvalidTransition):
        backend.env.complete(object_id)  # queued, not running
    backend.env.run(object_id)
    with pytest.raises(InvalidTransition):
        backend.env.no_capacity(object_id)  # running
    backend.env.complete(object_id)
    with pytest.raises(InvalidTransition):
        backend.env.preempt(object_id)


async def test_end_is_a_cancel_and_safe_to_repeat() -> None:
    backend = MemoryBackend(Shape.SLURM, auto_run=True)
    object_id = await _running(backend)
    await backend.end(object_id)
    await backend.end(object_id)
    await backend.end("never-existed")
    view = await _view(backend, object_id)
    assert (view.phase, view.cancelled) == (Phase.ENDED, True)
    assert backend.ever_released(object_id)


async def test_kubeflow_names_are_deterministic_and_a_second_creator_conflicts() -> None:
    from dispatch import ObjectExists

    backend = MemoryBackend(Shape.KUBEFLOW)
    spec = JobSpec(name="job", command=("train",))
    plan = make_plan("job", spec, backend.capabilities, supervised=True)
    assert await backend.create("job", 1, spec, plan) == "job-1"
    with pytest.raises(ObjectExists):
        await backend.create("job", 1, spec, plan)
    slurm = MemoryBackend(Shape.SLURM)
    assert [await slurm.create("job", 1, spec, plan) for _ in range(2)] == ["1", "2"]


KUBEFLOW_RESTART = Rule(
    on=(CauseKind.NON_ZERO_EXIT, CauseKind.OUT_OF_MEMORY), action=Action.RESTART, budget=2
)


@pytest.mark.parametrize("budget", [0, 1, 5])
@pytest.mark.parametrize("auto_run", [True, False])
async def test_kubeflow_restarts_natively_on_exactly_its_causes_up_to_its_budget(
    auto_run: bool, budget: int
) -> None:
    backend = MemoryBackend(Shape.KUBEFLOW, auto_run=auto_run)
    object_id = await _running(backend, (KUBEFLOW_RESTART.model_copy(update={"budget": budget}),))
    for i in range(budget):
        if i % 2:
            backend.env.out_of_memory(object_id)
        else:
            backend.env.exit(object_id, 3)
        view = await _view(backend, object_id)
        assert view.restarts == i + 1
        assert view.phase is (Phase.RUNNING if auto_run else Phase.QUEUED)
        if not auto_run:
            backend.env.run(object_id)
    backend.env.out_of_memory(object_id)
    view = await _view(backend, object_id)
    assert view.phase is Phase.ENDED
    assert view.cause is not None
    assert view.cause.kind is CauseKind.OUT_OF_MEMORY
    assert view.restarts == budget


@pytest.mark.parametrize("event", ["preempt", "lose_node", "time_limit", "requeue"])
async def test_kubeflow_restart_does_not_cover_other_causes(event: str) -> None:
    backend = MemoryBackend(Shape.KUBEFLOW, auto_run=True)
    object_id = await _running(backend, (KUBEFLOW_RESTART,))
    getattr(backend.env, event)(object_id)
    view = await _view(backend, object_id)
    assert (view.phase, view.restarts) == (Phase.ENDED, 0)


@pytest.mark.parametrize("event", ["preempt", "lose_node", "out_of_memory", "time_limit", "requeue"])
async def test_the_slurm_shape_never_restarts_in_place(event: str) -> None:
    # Slurm enforces no rule exactly: every rule is the supervisor's, and nothing is requeued in place.
    backend = MemoryBackend(Shape.SLURM, auto_run=True)
    rules = (Rule(on=(CauseKind.PREEMPTED, CauseKind.NODE_LOST), budget=5),)
    object_id = await _running(backend, rules)
    getattr(backend.env, event)(object_id)
    view = await _view(backend, object_id)
    assert (view.phase, view.restarts) == (Phase.ENDED, 0)


async def test_kubeflow_restarts_natively_on_failure_up_to_its_budget() -> None:
    backend = MemoryBackend(Shape.KUBEFLOW, auto_run=True)
    object_id = await _running(backend, (KUBEFLOW_RESTART,))
    backend.env.exit(object_id, 1)
    backend.env.out_of_memory(object_id)
    view = await _view(backend, object_id)
    assert (view.phase, view.restarts) == (Phase.RUNNING, 2)
    backend.env.exit(object_id, 2)
    view = await _view(backend, object_id)
    assert view.phase is Phase.ENDED
    assert view.cause is not None
    assert (view.cause.kind, view.cause.exit_code) == (CauseKind.NON_ZERO_EXIT, 2)


async def test_a_supervisor_records_native_restarts_then_fails_when_the_scheduler_gives_up() -> None:
    backend = MemoryBackend(Shape.KUBEFLOW, auto_run=True)
    store = MemoryStore()
    r = new_record(KUBEFLOW_RESTART, capabilities=backend.capabilities)
    await store.create(r)
    sup = Supervisor(backend, store)
    assert isinstance((await sup.drive("job")).step, Wait)
    (canonical,) = [o.id for o in await backend.list("job")]
    backend.env.exit(canonical, 1)
    assert isinstance((await sup.drive("job")).step, Wait)
    record, _ = await store.get("job")
    assert (record.submissions[0].restarts, record.plan.rules[0].firings) == (1, 1)
    backend.env.exit(canonical, 1)
    backend.env.exit(canonical, 1)
    assert isinstance((await sup.drive("job")).step, Done)
    record, _ = await store.get("job")
    assert (record.state, record.cause.kind) == (State.FAILED, CauseKind.NON_ZERO_EXIT)
    assert record.plan.rules[0].firings == 2
    assert len(record.submissions) == 1

"""A rule's backoff: the wait it computes, the decisions that record the end and wait it out, the
supervisor that authorizes once its clock has passed the time (a restarted one included), the
plan, and an end-to-end run on the memory backend with the library's own timer."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatch import (
    Action,
    Backoff,
    Capabilities,
    Cause,
    CauseKind,
    Enforcer,
    JobSpec,
    MemoryBackend,
    MemoryStore,
    ObjectView,
    Phase,
    Plan,
    PlanError,
    Record,
    RecoveryPolicy,
    Rule,
    Shape,
    State,
    Supervisor,
    compose,
    decide,
    due,
    make_plan,
    status,
)
from dispatch._backends.job import CAPABILITIES as JOB
from dispatch._backends.jobset import CAPABILITIES as JOBSET
from dispatch._backends.kubeflow import CAPABILITIES as KUBEFLOW
from dispatch._backends.memory._adapter import CAPABILITIES as MEMORY
from dispatch._cli._render import plan_lines
from dispatch._decide import (
    Authorize,
    End,
    RecordCanonical,
    RecordEnd,
    RecordOutcome,
    Wait,
    apply,
    unseen_canonical,
)
from dispatch._model import SUPERVISOR, CancelRequest
from tests.support.records import ADA, T0, new_record, step

PREEMPTED = Cause(kind=CauseKind.PREEMPTED, detail="preempted")
SUCCESS = Cause(kind=CauseKind.NONE)
SLOW = Backoff(base_seconds=10, factor=2, max_seconds=25)
"""10 s, 20 s, then the cap of 25 s."""


def slow(budget: int = 3, backoff: Backoff | None = SLOW) -> Rule:
    return Rule(on=(CauseKind.PREEMPTED,), budget=budget, backoff=backoff)


def obj(id: str, n: int, phase: Phase, cause: Cause | None = None, *, retained: bool = False) -> ObjectView:
    return ObjectView(id=id, job="job", submission=n, phase=phase, cause=cause, retained=retained)


def ended(n: int) -> list[ObjectView]:
    return [obj(str(n), n, Phase.ENDED, PREEMPTED)]


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def write(record: Record, w: RecordEnd | Authorize | RecordCanonical, seconds: float) -> Record:
    return apply(record, w, actor=SUPERVISOR, now=at(seconds))


def running(*rules: Rule) -> Record:
    """Submission 1 authorized and object "1" canonical, at T0."""
    return step(new_record(*rules), Authorize(1), RecordCanonical(1, "1"))


# the wait


def test_the_defaults_are_10_s_doubling_up_to_600_s() -> None:
    assert Backoff() == Backoff(base_seconds=10, factor=2, max_seconds=600)
    assert [Backoff().seconds(k) for k in (1, 2, 3, 7, 8)] == [10, 20, 40, 600, 600]
    assert slow(backoff=None).backoff is None  # a rule waits only when given a backoff


@pytest.mark.parametrize(
    ("backoff", "firing", "wait"),
    [
        (SLOW, 1, 10),  # the first firing: the base
        (SLOW, 2, 20),  # the k-th: base * factor ** (k - 1)
        (SLOW, 3, 25),  # capped
        (SLOW, 100, 25),  # capped, never overflowing
        (Backoff(base_seconds=0, factor=10, max_seconds=600), 5, 0),  # zero: at once
        (Backoff(base_seconds=30, factor=2, max_seconds=0), 1, 0),  # a zero cap: at once
        (Backoff(base_seconds=3, factor=1.5, max_seconds=600), 3, 6.75),
        (Backoff(base_seconds=86400, factor=10, max_seconds=86400), 100, 86400),
    ],
)
def test_the_wait_before_the_kth_firing(backoff: Backoff, firing: int, wait: float) -> None:
    assert backoff.seconds(firing) == wait


@pytest.mark.parametrize("field", ["baseSeconds", "maxSeconds"])
def test_a_negative_wait_is_refused(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        Backoff.model_validate({field: -1})


def test_a_factor_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="factor"):
        Backoff(factor=0.5)


@settings(max_examples=300, deadline=None)
@given(
    base=st.integers(0, 86400),
    factor=st.floats(1, 10),
    cap=st.integers(0, 86400),
    firing=st.integers(1, 100),
)
def test_the_wait_never_exceeds_the_cap_and_never_shrinks(
    base: int, factor: float, cap: int, firing: int
) -> None:
    backoff = Backoff(base_seconds=base, factor=factor, max_seconds=cap)
    wait = backoff.seconds(firing)
    assert 0 <= wait <= cap
    assert wait <= backoff.seconds(firing + 1)
    assert wait == pytest.approx(min(cap, base * factor ** (firing - 1)))


# the decisions


def test_a_rule_with_a_backoff_records_the_end_first() -> None:
    d = decide(running(slow()), ended(1))
    assert d.step == RecordEnd(1, 0, PREEMPTED)
    assert (d.state, d.cause) == (State.RECOVERING, PREEMPTED)


def test_a_rule_without_a_backoff_authorizes_at_once() -> None:
    assert decide(running(slow(backoff=None)), ended(1)).step == Authorize(2, 0, PREEMPTED)


def test_a_zero_wait_authorizes_at_once() -> None:
    zero = Backoff(base_seconds=0)
    assert decide(running(slow(backoff=zero)), ended(1)).step == Authorize(2, 0, PREEMPTED)


def test_the_recorded_end_keeps_its_time_and_the_wait_counts_from_it() -> None:
    r = write(running(slow()), RecordEnd(1, 0, PREEMPTED), 5)
    assert (r.submissions[0].cause, r.submissions[0].ended_at) == (PREEMPTED, at(5))
    assert r.plan.rules[0].firings == 0  # the budget is counted when the next submission is authorized
    d = decide(r, ended(1))
    assert d.step == Wait(
        "next submission at 2025-01-02T03:04:20Z (backoff 10 s before firing 1 of rule 0)",
        until=at(15),
        then=Authorize(2, 0, PREEMPTED),
    )
    assert (d.state, d.cause) == (State.RECOVERING, PREEMPTED)
    assert status(r, ended(1)).message == d.step.why


def test_the_authorization_comes_only_once_the_time_has_come() -> None:
    r = write(running(slow()), RecordEnd(1, 0, PREEMPTED), 5)
    d = decide(r, ended(1))
    assert due(d, at(14.999)) == d
    for now in (at(15), at(100)):
        assert due(d, now).step == Authorize(2, 0, PREEMPTED)
        assert due(d, now).state is State.RECOVERING


def test_the_kth_firing_waits_longer_up_to_the_cap() -> None:
    r = running(slow())
    waits = []
    clock = 0.0
    for n in (1, 2, 3):
        r = write(r, RecordEnd(n, 0, PREEMPTED), clock)
        wait = decide(r, ended(n)).step
        assert isinstance(wait, Wait)
        assert wait.until is not None
        assert isinstance(wait.then, Authorize)
        waits.append((wait.until - at(clock)).total_seconds())
        clock = (wait.until - T0).total_seconds()
        r = write(r, wait.then, clock)
        r = write(r, RecordCanonical(n + 1, str(n + 1)), clock)
    assert waits == [10, 20, 25]
    assert r.plan.rules[0].firings == 3
    # the budget is used up: the fourth end fails, with no wait
    assert decide(r, ended(4)).step == RecordOutcome(State.FAILED, PREEMPTED)


def test_the_recorded_end_decides_though_the_object_has_gone_since() -> None:
    """A deleted ended object would read as 'unknown', which no rule covers."""
    r = write(running(slow()), RecordEnd(1, 0, PREEMPTED), 0)
    assert decide(r, []).step == decide(r, ended(1)).step
    assert unseen_canonical(r, []) is None  # nothing to confirm either


def test_a_retained_canonical_is_let_go_once_its_end_is_recorded() -> None:
    before = running(slow())
    gone = [obj("1", 1, Phase.ENDED, PREEMPTED, retained=True)]
    assert decide(before, gone).step == RecordEnd(1, 0, PREEMPTED)
    after = write(before, RecordEnd(1, 0, PREEMPTED), 0)
    assert decide(after, gone).step == End("1", orphan=False)


def test_a_cancel_in_the_wait_ends_the_job_at_once() -> None:
    r = write(running(slow()), RecordEnd(1, 0, PREEMPTED), 0)
    r = r.model_copy(update={"cancel": CancelRequest(actor=ADA, time=at(1))})
    d = decide(r, ended(1))
    assert isinstance(d.step, RecordOutcome)
    assert d.step.state is State.CANCELLED
    assert d.state is State.CANCELLED


def test_the_end_is_recorded_once() -> None:
    r = write(running(slow()), RecordEnd(1, 0, PREEMPTED), 0)
    with pytest.raises(ValueError, match="end unrecorded"):
        write(r, RecordEnd(1, 0, PREEMPTED), 1)


def test_every_recorded_end_has_its_time() -> None:
    """Without a backoff too: the authorization or the outcome that records a cause records when."""
    r = write(running(slow(backoff=None)), Authorize(2, 0, PREEMPTED), 7)
    assert r.submissions[0].ended_at == at(7)
    r = apply(
        write(r, RecordCanonical(2, "2"), 8),
        RecordOutcome(State.SUCCEEDED, SUCCESS),
        actor=SUPERVISOR,
        now=at(9),
    )
    assert r.submissions[1].ended_at == at(9)


@settings(max_examples=200, deadline=None)
@given(
    base=st.integers(0, 50),
    factor=st.sampled_from([1.0, 1.5, 2.0, 3.0]),
    cap=st.integers(0, 120),
    budget=st.integers(0, 6),
    ticks=st.lists(st.floats(0, 40), min_size=1, max_size=60),
)
def test_a_supervisor_loop_never_authorizes_early_nor_over_budget(
    base: int, factor: float, cap: int, budget: int, ticks: list[float]
) -> None:
    """The supervisor's own loop over decide, due and apply, with a clock that jumps by ``ticks``
    and the scheduler preempting every submission as soon as it is released."""
    backoff = Backoff(base_seconds=base, factor=factor, max_seconds=cap)
    r = step(new_record(slow(budget, backoff)), Authorize(1), RecordCanonical(1, "1"))
    now = T0 + timedelta(seconds=1)
    for tick in ticks:
        now += timedelta(seconds=tick)
        for _ in range(4):
            cur = r.current
            assert cur is not None
            d = due(decide(r, ended(cur.n)), now)
            if isinstance(d.step, Wait):
                assert d.step.until is not None
                assert d.step.until > now
                assert cur.ended_at is not None
                assert d.step.until - cur.ended_at <= timedelta(seconds=cap)
                break
            if isinstance(d.step, RecordOutcome):
                break
            assert isinstance(d.step, RecordEnd | Authorize)
            r = apply(r, d.step, actor=SUPERVISOR, now=now)
            if isinstance(d.step, Authorize):
                r = apply(
                    r, RecordCanonical(d.step.submission, str(d.step.submission)), actor=SUPERVISOR, now=now
                )
    assert r.plan.rules[0].firings <= budget
    for k, (previous, sub) in enumerate(zip(r.submissions, r.submissions[1:], strict=False), start=1):
        assert previous.ended_at is not None
        assert sub.authorized_at >= previous.ended_at + timedelta(seconds=backoff.seconds(k))


# the supervisor


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


async def _preempted_and_waiting(clock: Clock) -> tuple[MemoryStore, MemoryBackend, Wait]:
    store, backend = MemoryStore(), MemoryBackend(Shape.SLURM, auto_run=True)
    cluster = compose(backend, store=store)
    spec = JobSpec(name="job", command=("train",), recovery=RecoveryPolicy(rules=(slow(),)))
    await cluster.operator.submit(spec, ADA, supervised=True)
    supervisor = Supervisor(backend, store, clock=clock)
    await supervisor.drive("job")
    backend.env.preempt(backend.objects()[0].id)
    decision = await supervisor.drive("job")
    assert isinstance(decision.step, Wait)
    assert decision.step.until == T0 + timedelta(seconds=10)
    return store, backend, decision.step


async def test_a_restarted_supervisor_resumes_the_wait_exactly() -> None:
    clock = Clock()
    store, backend, wait = await _preempted_and_waiting(clock)
    clock.now = T0 + timedelta(seconds=4)
    again = Supervisor(backend, store, clock=clock)  # a new process: nothing kept but the record
    assert (await again.prepare("job")).decision.step == wait
    assert again.seconds_until(wait) == 6
    clock.now = T0 + timedelta(seconds=10)
    authorized = (await again.step("job")).step
    assert isinstance(authorized, Authorize)
    assert (authorized.submission, authorized.rule) == (2, 0)
    record = (await store.get("job")).record
    assert [s.n for s in record.submissions] == [1, 2]
    assert record.submissions[1].authorized_at == T0 + timedelta(seconds=10)


async def test_a_cancel_in_the_wait_settles_the_job_without_waiting() -> None:
    clock = Clock()
    store, backend, _ = await _preempted_and_waiting(clock)
    cluster = compose(backend, store=store)
    await cluster.operator.cancel("job", ADA)
    record = await Supervisor(backend, store, clock=clock).run("job")  # the clock never moves
    assert record.state is State.CANCELLED
    assert record.settled
    assert len(record.submissions) == 1


async def test_two_preemptions_with_a_backoff_on_the_memory_backend() -> None:
    """End to end with the library's run(): its timer, not its poll, wakes it at the time (the poll
    interval is longer than the whole test may take)."""
    store, backend = MemoryStore(), MemoryBackend(Shape.SLURM, auto_run=True)
    cluster = compose(backend, store=store)
    one = Backoff(base_seconds=1, factor=1, max_seconds=1)
    spec = JobSpec(name="job", command=("train",), recovery=RecoveryPolicy(rules=(slow(2, one),)))
    await cluster.operator.submit(spec, ADA, supervised=True)
    supervisor = Supervisor(backend, store, poll_interval=3600)

    def scheduler() -> None:
        for o in backend.objects():
            if o.phase is Phase.RUNNING:
                (backend.env.preempt if o.submission < 3 else backend.env.complete)(o.id)

    def wake() -> None:  # the scheduler acts after the change that woke it, as a real one does
        asyncio.get_running_loop().call_soon(scheduler)

    unsubscribe = backend.subscribe("job", wake)
    try:
        async with asyncio.timeout(20):
            record = await supervisor.run("job")
    finally:
        unsubscribe()
    assert (record.state, record.settled, len(record.submissions)) == (State.SUCCEEDED, True, 3)
    for previous, sub in zip(record.submissions, record.submissions[1:], strict=False):
        assert previous.ended_at is not None
        assert sub.authorized_at - previous.ended_at >= timedelta(seconds=1)


# the plan


def plan_of(rule: Rule, capabilities: Capabilities) -> Plan:
    spec = JobSpec(name="job", command=("train",), recovery=RecoveryPolicy(rules=(rule,)))
    return make_plan("job", spec, capabilities, supervised=True)


def test_the_plan_carries_each_rules_backoff() -> None:
    rule = plan_of(slow(), MEMORY[Shape.SLURM]).rules[0]
    assert (rule.enforcer, rule.backoff, rule.scheduler_backoff) == (Enforcer.SUPERVISOR, SLOW, None)


NATIVE = Rule(on=(CauseKind.NON_ZERO_EXIT, CauseKind.OUT_OF_MEMORY), action=Action.RESTART, budget=3)


@pytest.mark.parametrize(
    ("capabilities", "words"),
    [(JOB, "10 s, doubling up to 10 min"), (JOBSET, "at once"), (KUBEFLOW, "10 s, doubling up to 5 min")],
)
def test_a_native_rule_says_the_schedulers_own_backoff(capabilities: Capabilities, words: str) -> None:
    rule = plan_of(NATIVE, capabilities).rules[0]
    assert rule.enforcer is Enforcer.SCHEDULER
    assert rule.backoff is None
    assert words in (rule.scheduler_backoff or "")


@pytest.mark.parametrize("capabilities", [JOB, JOBSET, KUBEFLOW])
def test_a_backoff_on_a_restart_the_scheduler_enforces_is_refused_naming_the_field(
    capabilities: Capabilities,
) -> None:
    with pytest.raises(PlanError, match=r"spec\.recovery\.rules\[0\]\.backoff") as refused:
        plan_of(NATIVE.model_copy(update={"backoff": Backoff()}), capabilities)
    assert refused.value.rule == 0


def test_kubectl_dispatch_plan_shows_each_rules_backoff() -> None:
    assert plan_lines(plan_of(slow(), MEMORY[Shape.SLURM]))[:2] == [
        "rule 0 is enforced by the supervisor",
        "  backoff: 10 s x 2 per firing, at most 25 s",
    ]
    assert plan_lines(plan_of(NATIVE, JOB))[1].startswith(
        "  the scheduler's own backoff: the Job controller's"
    )
    assert plan_lines(plan_of(slow(backoff=None), MEMORY[Shape.SLURM]))[1].startswith("uncovered:")

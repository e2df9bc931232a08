"""A submission's time limit, the job's deadline and the stop with its grace: the model's fields
and their refusals, the plan (who enforces each), the decisions (the stop recorded before the
object is ended, the waits computed from the record and the observed start, the deadline that cuts
a backoff short), the supervisor on the memory backend (a restarted one resumes the wait exactly),
and the backends' part (the pods' grace, the Job's activeDeadlineSeconds, Slurm's --signal)."""

from __future__ import annotations

import importlib
import re
from datetime import datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from dispatch import (
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
    PlanError,
    Record,
    RecoveryPolicy,
    Rule,
    Shape,
    State,
    StopKind,
    StopPolicy,
    Supervisor,
    WarningSignal,
    compose,
    decide,
    due,
    make_plan,
)
from dispatch._backends.job import CAPABILITIES as JOB
from dispatch._backends.kubeflow import CAPABILITIES as KUBEFLOW
from dispatch._backends.slurm import CAPABILITIES as SLURM
from dispatch._backends.slurm import SlurmOptions
from dispatch._backends.trainjob import CAPABILITIES as TRAINJOB
from dispatch._cli._render import plan_lines
from dispatch._decide import Authorize, End, RecordCanonical, RecordOutcome, RecordStop, Wait, apply
from dispatch._model import SUPERVISOR
from tests.support.records import ADA, T0

NOTHING_NATIVE = Capabilities()
DEFAULT_STOP = StopPolicy()
TIME_LIMIT_ONCE = Rule(on=(CauseKind.TIME_LIMIT,), budget=1)
PREEMPTED = Cause(kind=CauseKind.PREEMPTED, detail="preempted")


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def job(
    *rules: Rule,
    capabilities: Capabilities = NOTHING_NATIVE,
    time_limit: int | None = 100,
    deadline: int | None = None,
    stop: StopPolicy = DEFAULT_STOP,
) -> Record:
    spec = JobSpec(
        name="job",
        command=("train",),
        recovery=RecoveryPolicy(rules=rules),
        time_limit_seconds=time_limit,
        deadline_seconds=deadline,
        stop=stop,
    )
    return Record(
        job="job",
        spec=spec,
        plan=make_plan("job", spec, capabilities, supervised=True),
        submitted_by=ADA,
        submitted_at=T0,
        supervised=True,
    )


def write(record: Record, *steps: object, seconds: float = 0) -> Record:
    for s in steps:
        record = apply(record, s, actor=SUPERVISOR, now=at(seconds))  # type: ignore[arg-type]
    return record


def running(n: int, started: float | None = 10.0) -> ObjectView:
    start = at(started) if started is not None else None
    return ObjectView(id=str(n), job="job", submission=n, phase=Phase.RUNNING, started_at=start)


def stopped(n: int, how: StopKind | None = StopKind.GRACEFUL) -> ObjectView:
    cause = Cause(kind=CauseKind.NONE, detail="cancelled", stop=how)
    return ObjectView(
        id=str(n), job="job", submission=n, phase=Phase.ENDED, cause=cause, cancelled=True, stop=how
    )


# ---- the model --------------------------------------------------------------------------------------


def test_no_rule_can_cover_the_deadline() -> None:
    with pytest.raises(ValidationError, match="deadline-exceeded"):
        Rule(on=(CauseKind.DEADLINE_EXCEEDED,), budget=1)


def test_a_warning_needs_a_time_limit_longer_than_itself() -> None:
    with pytest.raises(ValidationError, match="timeLimitSeconds, which is not set"):
        JobSpec(name="j", command=("x",), stop=StopPolicy(warning_seconds=10))
    with pytest.raises(ValidationError, match="must be less than timeLimitSeconds"):
        JobSpec(name="j", command=("x",), time_limit_seconds=10, stop=StopPolicy(warning_seconds=10))
    with pytest.raises(ValidationError, match=re.escape("needs stop.warningSeconds")):
        JobSpec(name="j", command=("x",), stop=StopPolicy(warning_signal=WarningSignal.SIGUSR1))


def test_the_default_grace_is_the_kubelets() -> None:
    assert JobSpec(name="j", command=("x",)).stop.grace_period_seconds == 30


@pytest.mark.parametrize(
    ("options", "new"),
    [
        ({"timeLimitMinutes": 5}, "spec.timeLimitSeconds"),
        ({"time_limit_minutes": 5}, "spec.timeLimitSeconds"),
    ],
)
def test_an_old_field_is_refused_naming_the_new_one(options: dict[str, int], new: str) -> None:
    with pytest.raises(ValidationError, match=f"timeLimitMinutes is replaced by {new}"):
        SlurmOptions.model_validate(options)


def test_the_pods_old_grace_is_refused_naming_the_new_field() -> None:
    from dispatch._backends.job import JobOptions

    with pytest.raises(ValidationError, match=re.escape("replaced by spec.stop.gracePeriodSeconds")):
        JobOptions.model_validate({"image": "i:1", "terminationGracePeriodSeconds": 10})


# ---- the plan ---------------------------------------------------------------------------------------


def test_the_deadline_is_uncovered_only_where_the_job_has_one() -> None:
    assert CauseKind.DEADLINE_EXCEEDED not in job().plan.uncovered
    planned = job(deadline=500).plan
    assert planned.uncovered[-1] is CauseKind.DEADLINE_EXCEEDED
    assert planned.deadline is not None
    assert planned.deadline.enforcer is Enforcer.SUPERVISOR


@pytest.mark.parametrize(
    ("capabilities", "enforcer"),
    [
        (JOB, Enforcer.SCHEDULER),
        (SLURM, Enforcer.SCHEDULER),
        (KUBEFLOW, Enforcer.SUPERVISOR),
        (TRAINJOB, Enforcer.SUPERVISOR),
        (Capabilities(), Enforcer.SUPERVISOR),
    ],
)
def test_the_time_limit_is_the_schedulers_only_where_it_enforces_it(
    capabilities: Capabilities, enforcer: Enforcer
) -> None:
    planned = job(capabilities=capabilities).plan
    assert planned.time_limit is not None
    assert planned.time_limit.enforcer is enforcer
    assert any(
        line.startswith(f"time limit 100 s is enforced by the {enforcer}") for line in plan_lines(planned)
    )


def test_a_warning_on_a_job_is_the_supervisors_stop() -> None:
    """The Job controller sends no warning: with one, the supervisor begins the stop early."""
    planned = job(capabilities=JOB, stop=StopPolicy(warning_seconds=20)).plan
    assert planned.time_limit is not None
    assert planned.time_limit.enforcer is Enforcer.SUPERVISOR
    assert "20 s before the limit" in planned.time_limit.how


def test_a_warning_signal_kubernetes_cannot_send_is_refused_naming_the_field() -> None:
    stop = StopPolicy(warning_seconds=20, warning_signal=WarningSignal.SIGUSR1)
    with pytest.raises(PlanError, match=re.escape("spec.stop.warningSignal")):
        job(capabilities=KUBEFLOW, stop=stop)
    assert job(capabilities=SLURM, stop=stop).plan.time_limit is not None


def test_a_grace_the_backend_cannot_give_is_refused_naming_the_field() -> None:
    with pytest.raises(PlanError, match=re.escape("spec.stop.gracePeriodSeconds")):
        job(capabilities=TRAINJOB, stop=StopPolicy(grace_period_seconds=90))
    assert job(capabilities=KUBEFLOW, stop=StopPolicy(grace_period_seconds=90)).plan is not None


def test_an_unsupervised_job_cannot_have_a_deadline() -> None:
    spec = JobSpec(name="j", command=("x",), deadline_seconds=10)
    with pytest.raises(PlanError, match=re.escape("spec.deadlineSeconds")):
        make_plan("j", spec, Capabilities(), supervised=False)


# ---- the decisions ----------------------------------------------------------------------------------


def test_a_running_submission_waits_for_its_time_limit_from_its_start() -> None:
    r = write(job(TIME_LIMIT_ONCE), Authorize(1), RecordCanonical(1, "1"))
    d = decide(r, [running(1, started=10)])
    assert d.state is State.RUNNING
    assert isinstance(d.step, Wait)
    assert d.step.until == at(110)
    assert isinstance(d.step.then, RecordStop)
    assert d.step.then.cause.kind is CauseKind.TIME_LIMIT
    assert due(d, at(109)).step == d.step
    assert isinstance(due(d, at(110)).step, RecordStop)


def test_no_start_no_time_limit_wait() -> None:
    r = write(job(TIME_LIMIT_ONCE), Authorize(1), RecordCanonical(1, "1"))
    d = decide(r, [running(1, started=None)])
    assert isinstance(d.step, Wait)
    assert d.step.until is None


def test_a_warning_begins_the_stop_early_and_kills_at_the_limit() -> None:
    warned = job(TIME_LIMIT_ONCE, stop=StopPolicy(warning_seconds=30, grace_period_seconds=5))
    r = write(warned, Authorize(1), RecordCanonical(1, "1"))
    d = decide(r, [running(1, started=10)])
    assert isinstance(d.step, Wait)
    assert d.step.until == at(80)
    assert isinstance(d.step.then, RecordStop)
    r = write(r, d.step.then, seconds=80)
    end = decide(r, [running(1, started=10)]).step
    assert isinstance(end, End)
    assert end.grace_seconds == 30  # SIGTERM at 80, SIGKILL at the limit, 110


def test_the_scheduler_s_time_limit_sets_no_timer() -> None:
    r = write(job(TIME_LIMIT_ONCE, capabilities=JOB), Authorize(1), RecordCanonical(1, "1"))
    d = decide(r, [running(1)])
    assert isinstance(d.step, Wait)
    assert d.step.until is None


def test_a_time_limit_stop_is_recorded_then_ended_then_read_as_time_limit() -> None:
    r = write(job(TIME_LIMIT_ONCE), Authorize(1), RecordCanonical(1, "1"))
    r = write(r, RecordStop(1, Cause(kind=CauseKind.TIME_LIMIT, detail="limit")), seconds=110)
    cur = r.current
    assert cur is not None
    assert cur.stop is not None
    assert (cur.stop.actor, cur.stop.time) == (SUPERVISOR, at(110))
    d = decide(r, [running(1)])
    assert d.step == End("1", orphan=False, stop=CauseKind.TIME_LIMIT)
    assert d.step.grace_seconds == 30
    assert d.step.grace_seconds == 30
    # Ended by dispatch's stop: not a cancel but the stop's cause, with how the stop went.
    d = decide(r, [stopped(1, StopKind.FORCED)])
    assert isinstance(d.step, Authorize)
    assert d.step.cause is not None
    assert (d.step.cause.kind, d.step.cause.stop) == (CauseKind.TIME_LIMIT, StopKind.FORCED)
    r = write(r, d.step, seconds=140)
    assert r.history[-1].cause.stop is StopKind.FORCED
    assert r.submissions[0].cause is not None
    assert r.submissions[0].cause.kind is CauseKind.TIME_LIMIT


def test_a_stopped_canonical_gone_from_the_scheduler_ended_by_the_stop() -> None:
    """A restarted operator no longer knows the object it deleted: still the stop's cause."""
    r = write(job(TIME_LIMIT_ONCE), Authorize(1), RecordCanonical(1, "1"))
    r = write(r, RecordStop(1, Cause(kind=CauseKind.TIME_LIMIT)), seconds=110)
    d = decide(r, [])
    assert isinstance(d.step, Authorize)
    assert d.step.cause is not None
    assert d.step.cause.kind is CauseKind.TIME_LIMIT


def test_a_stopped_submission_is_not_followed_while_it_terminates() -> None:
    r = write(job(TIME_LIMIT_ONCE), Authorize(1), RecordCanonical(1, "1"))
    r = write(r, RecordStop(1, Cause(kind=CauseKind.TIME_LIMIT)), seconds=110)
    terminating = stopped(1).model_copy(update={"terminating": True})
    d = decide(r, [terminating])
    assert isinstance(d.step, Wait)
    assert "grace period" in d.step.why


def test_an_uncovered_time_limit_fails_the_job() -> None:
    r = write(job(), Authorize(1), RecordCanonical(1, "1"))
    r = write(r, RecordStop(1, Cause(kind=CauseKind.TIME_LIMIT)), seconds=110)
    d = decide(r, [stopped(1)])
    assert isinstance(d.step, RecordOutcome)
    assert (d.step.state, d.step.cause.kind) == (State.FAILED, CauseKind.TIME_LIMIT)


def test_the_deadline_stops_the_running_submission_and_fails_the_job() -> None:
    r = write(job(TIME_LIMIT_ONCE, time_limit=None, deadline=50), Authorize(1), RecordCanonical(1, "1"))
    d = decide(r, [running(1)])
    assert isinstance(d.step, Wait)
    assert d.step.until == at(50)
    stop = due(d, at(50)).step
    assert isinstance(stop, RecordStop)
    assert stop.cause.kind is CauseKind.DEADLINE_EXCEEDED
    r = write(r, stop, seconds=50)
    assert isinstance(decide(r, [running(1)]).step, End)
    d = decide(r, [stopped(1)])
    assert isinstance(d.step, RecordOutcome)
    assert (d.step.state, d.step.cause.kind, d.step.cause.stop) == (
        State.FAILED,
        CauseKind.DEADLINE_EXCEEDED,
        StopKind.GRACEFUL,
    )


def test_a_failure_during_the_deadline_stop_is_still_the_deadline() -> None:
    """Nothing is resubmitted past the deadline, whatever else ended the stopped submission."""
    r = write(job(Rule(on=(CauseKind.PREEMPTED,), budget=3), time_limit=None, deadline=50))
    r = write(r, Authorize(1), RecordCanonical(1, "1"))
    r = write(r, RecordStop(1, Cause(kind=CauseKind.DEADLINE_EXCEEDED)), seconds=50)
    preempted = ObjectView(id="1", job="job", submission=1, phase=Phase.ENDED, cause=PREEMPTED)
    d = decide(r, [preempted])
    assert isinstance(d.step, RecordOutcome)
    assert d.step.cause.kind is CauseKind.DEADLINE_EXCEEDED


def test_a_backoff_past_the_deadline_ends_the_job_at_the_deadline() -> None:
    rule = Rule(on=(CauseKind.PREEMPTED,), budget=3, backoff=Backoff(base_seconds=100))
    r = write(job(rule, time_limit=None, deadline=50), Authorize(1), RecordCanonical(1, "1"))
    ended = ObjectView(id="1", job="job", submission=1, phase=Phase.ENDED, cause=PREEMPTED)
    d = decide(r, [ended])
    r = write(r, d.step, seconds=20)  # RecordEnd: the backoff would end at 120
    d = decide(r, [ended])
    assert isinstance(d.step, Wait)
    assert d.step.until == at(50)
    failed = due(d, at(50))
    assert isinstance(failed.step, RecordOutcome)
    assert failed.state is State.FAILED
    r = write(r, failed.step, seconds=50)
    assert r.cause.kind is CauseKind.DEADLINE_EXCEEDED
    # The submission keeps how it ended; the job's outcome says why nothing followed.
    assert r.submissions[0].cause == PREEMPTED
    assert len(r.submissions) == 1


def test_a_backoff_within_the_deadline_is_unchanged() -> None:
    rule = Rule(on=(CauseKind.PREEMPTED,), budget=3, backoff=Backoff(base_seconds=10))
    r = write(job(rule, time_limit=None, deadline=500), Authorize(1), RecordCanonical(1, "1"))
    ended = ObjectView(id="1", job="job", submission=1, phase=Phase.ENDED, cause=PREEMPTED)
    r = write(r, decide(r, [ended]).step, seconds=20)
    d = decide(r, [ended])
    assert isinstance(d.step, Wait)
    assert (d.step.until, type(d.step.then)) == (at(30), Authorize)


@settings(max_examples=200, deadline=None)
@given(
    limit=st.integers(1, 1000),
    warning=st.one_of(st.none(), st.integers(1, 999)),
    deadline=st.one_of(st.none(), st.integers(1, 3000)),
    started=st.integers(0, 1000),
    now=st.integers(0, 5000),
)
def test_no_stop_comes_before_its_time(
    limit: int, warning: int | None, deadline: int | None, started: int, now: int
) -> None:
    """At any time, the step due is a stop only once the time limit's (warned) stop or the
    deadline has come, and the wait never ends after either."""
    if warning is not None and warning >= limit:
        warning = None
    r = job(TIME_LIMIT_ONCE, time_limit=limit, deadline=deadline, stop=StopPolicy(warning_seconds=warning))
    r = write(r, Authorize(1), RecordCanonical(1, "1"))
    decision = decide(r, [running(1, started=started)])
    assert isinstance(decision.step, Wait)
    limit_at = at(started + limit - (warning or 0))
    deadline_at = at(deadline) if deadline is not None else None
    first = min(t for t in (limit_at, deadline_at) if t is not None)
    assert decision.step.until == first
    step = due(decision, at(now)).step
    if at(now) < first:
        assert isinstance(step, Wait)
    else:
        assert isinstance(step, RecordStop)
        # Once the deadline has come it wins (it ends the job); before it, the time limit's stop.
        passed = deadline_at is not None and at(now) >= deadline_at
        expected = CauseKind.DEADLINE_EXCEEDED if passed else CauseKind.TIME_LIMIT
        assert step.cause.kind is expected


# ---- the supervisor on the memory backend ----------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


async def test_a_time_limit_is_hit_and_recovered_and_a_restart_resumes_the_wait() -> None:
    clock = Clock()
    store = MemoryStore()
    backend = MemoryBackend(Shape.KUBEFLOW, auto_run=True, clock=clock)
    cluster = compose(backend, store=store)
    spec = JobSpec(
        name="job",
        command=("train",),
        recovery=RecoveryPolicy(rules=(TIME_LIMIT_ONCE,)),
        time_limit_seconds=60,
    )
    await cluster.operator.submit(spec, ADA, supervised=True)
    supervisor = Supervisor(backend, store, clock=clock)
    wait = (await supervisor.drive("job")).step
    assert isinstance(wait, Wait)
    assert wait.until == at(60)
    clock.now = at(30)
    again = Supervisor(backend, store, clock=clock)  # a new process: nothing kept but the record
    assert (await again.prepare("job")).decision.step == wait
    assert again.seconds_until(wait) == 30
    clock.now = at(60)
    backend.env.ignore_sigterm(backend.objects()[0].id)
    await again.drive("job")
    record = (await store.get("job")).record
    assert [s.n for s in record.submissions] == [1, 2]
    first = record.submissions[0]
    assert first.cause is not None
    assert (first.cause.kind, first.cause.stop) == (CauseKind.TIME_LIMIT, StopKind.FORCED)
    assert first.stop is not None
    assert first.stop.time == at(60)
    assert record.history[-1].cause.kind is CauseKind.TIME_LIMIT
    backend.env.complete(backend.objects()[1].id)
    settled = await again.run("job")
    assert settled.state is State.SUCCEEDED


async def test_the_deadline_ends_the_job_on_the_memory_backend() -> None:
    clock = Clock()
    store = MemoryStore()
    backend = MemoryBackend(Shape.SLURM, auto_run=True, clock=clock)
    cluster = compose(backend, store=store)
    spec = JobSpec(name="job", command=("train",), deadline_seconds=45)
    await cluster.operator.submit(spec, ADA, supervised=True)
    supervisor = Supervisor(backend, store, clock=clock)
    wait = (await supervisor.drive("job")).step
    submitted = (await store.get("job")).record.submitted_at
    assert isinstance(wait, Wait)
    assert wait.until == submitted + timedelta(seconds=45)
    clock.now = submitted + timedelta(seconds=45)
    record = await supervisor.run("job")
    assert (record.state, record.cause.kind, record.cause.stop) == (
        State.FAILED,
        CauseKind.DEADLINE_EXCEEDED,
        StopKind.GRACEFUL,
    )
    assert record.settled
    assert all(o.phase is Phase.ENDED for o in backend.objects())
    assert [t.actor for t in record.history] == [SUPERVISOR]


@pytest.mark.parametrize(("deaf", "how"), [(False, StopKind.GRACEFUL), (True, StopKind.FORCED)])
async def test_a_cancel_records_how_its_stop_went_when_the_job_settles(deaf: bool, how: StopKind) -> None:
    store = MemoryStore()
    backend = MemoryBackend(Shape.SLURM, auto_run=True)
    cluster = compose(backend, store=store)
    await cluster.operator.submit(JobSpec(name="job", command=("train",)), ADA, supervised=True)
    supervisor = Supervisor(backend, store)
    await supervisor.drive("job")
    if deaf:
        backend.env.ignore_sigterm(backend.objects()[0].id)
    await cluster.operator.cancel("job", ADA)
    record = await supervisor.run("job")
    assert record.state is State.CANCELLED
    assert record.cause.stop is how
    assert record.history[-1].cause.stop is None  # (recorded before the stop)


# ---- the backends' part -----------------------------------------------------------------------------


def _pod_specs(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Every pod template's spec in a built object, wherever its kind keeps them."""
    found: list[dict[str, Any]] = []
    if isinstance(body, dict):
        if (
            "template" in body
            and isinstance(body["template"], dict)
            and "containers" in body["template"].get("spec", {})
        ):
            found.append(body["template"]["spec"])
        for value in body.values():
            found += _pod_specs(value)
    elif isinstance(body, list):
        for item in body:
            found += _pod_specs(item)
    return found


@pytest.mark.parametrize("backend", ["job", "jobset", "kubeflow"])
def test_the_pods_get_the_jobs_grace(backend: str) -> None:
    """Every kind's pods: ``spec.stop.gracePeriodSeconds`` as their terminationGracePeriodSeconds."""
    from dispatch import _registry
    from dispatch._workload import Target

    info = _registry.get(backend)
    assert info is not None
    assert info.options is not None
    kind = importlib.import_module(f"dispatch._backends.{backend}._kind")
    target = Target(namespace="ns", job_name="j", submission=1)
    options = info.options.model_validate({"image": "i:1"})
    spec = JobSpec(name="j", command=("x",), stop=StopPolicy(grace_period_seconds=90), **{backend: options})
    body = kind.build(target, spec, make_plan("j", spec, info.capabilities, supervised=True))
    pods = _pod_specs(body)
    assert pods
    assert all(p["terminationGracePeriodSeconds"] == 90 for p in pods)
    assert "activeDeadlineSeconds" not in body["spec"]


def test_a_job_s_time_limit_is_its_active_deadline_unless_warned() -> None:
    from dispatch._backends.job import JobOptions
    from dispatch._backends.job._kind import build
    from dispatch._workload import Target

    target = Target(namespace="ns", job_name="j", submission=1)
    for stop, deadline, grace in ((StopPolicy(), 600, None), (StopPolicy(warning_seconds=60), None, 60)):
        spec = JobSpec(
            name="j", command=("x",), time_limit_seconds=600, stop=stop, job=JobOptions(image="i:1")
        )
        job_spec = build(target, spec, make_plan("j", spec, JOB, supervised=True))["spec"]
        assert job_spec.get("activeDeadlineSeconds") == deadline
        # With a warning the pods' grace lasts from the early SIGTERM until the limit.
        assert job_spec["template"]["spec"].get("terminationGracePeriodSeconds") == grace


def test_slurm_gets_minutes_rounded_up_and_the_warning() -> None:
    from dispatch._backends.slurm._dialects import V0038, V0040, SubmitRequest

    req = SubmitRequest(
        script="s", name="n", comment="c", environment={}, time_limit_minutes=2, warning=("USR1", 30)
    )
    old = V0038().submit_body(req)["job"]
    assert (old["time_limit"], old["signal"]) == (2, "10@30")
    new = V0040().submit_body(req)["job"]
    assert new["kill_warning_signal"] == "USR1"
    assert new["kill_warning_delay"]["number"] == 30
    assert "kill_warning_flags" not in new  # (the steps: the program runs as one)


@settings(max_examples=200, deadline=None)
@given(
    deadline=st.integers(1, 200),
    base=st.integers(0, 60),
    ticks=st.lists(st.floats(0, 30), min_size=1, max_size=40),
)
def test_nothing_is_authorized_at_or_after_the_deadline(deadline: int, base: int, ticks: list[float]) -> None:
    """The supervisor's loop over decide, due and apply with a clock that jumps by ``ticks`` and
    every submission preempted at once: no authorization at or after the deadline, and once the
    clock has passed it the job has failed with ``deadline-exceeded``."""
    rule = Rule(on=(CauseKind.PREEMPTED,), budget=100, backoff=Backoff(base_seconds=base, factor=1))
    r = write(job(rule, time_limit=None, deadline=deadline), Authorize(1), RecordCanonical(1, "1"))
    now = T0
    for tick in ticks:
        now += timedelta(seconds=tick)
        for _ in range(6):
            if r.state.is_outcome:
                break
            cur = r.current
            assert cur is not None
            live = ObjectView(id=str(cur.n), job="job", submission=cur.n, phase=Phase.ENDED, cause=PREEMPTED)
            d = due(decide(r, [live]), now)
            if isinstance(d.step, Wait):
                break
            if isinstance(d.step, End):
                break
            r = apply(r, d.step, actor=SUPERVISOR, now=now)  # type: ignore[arg-type]
            if isinstance(d.step, Authorize):
                chosen = RecordCanonical(d.step.submission, str(d.step.submission))
                r = apply(r, chosen, actor=SUPERVISOR, now=now)
    limit = T0 + timedelta(seconds=deadline)
    assert all(s.authorized_at < limit for s in r.submissions)
    if now >= limit:
        assert r.state is State.FAILED
        assert r.cause.kind is CauseKind.DEADLINE_EXCEEDED


def test_a_pods_last_state_says_how_its_stop_went_and_when_it_started() -> None:
    from dispatch._workload._classify import pods_started
    from dispatch._workload._evidence import stopped_how

    def pod(*states: dict[str, Any]) -> dict[str, Any]:
        return {"status": {"containerStatuses": [{"name": "main", "state": s} for s in states]}}

    killed = pod({"terminated": {"exitCode": 137, "startedAt": "2025-01-02T03:04:10Z"}})
    trapped = pod({"terminated": {"exitCode": 0, "startedAt": "2025-01-02T03:04:06Z"}})
    running = pod({"running": {"startedAt": "2025-01-02T03:04:08Z"}})
    assert stopped_how(killed) is StopKind.FORCED
    assert stopped_how(pod({"terminated": {"exitCode": 143, "signal": 9}})) is StopKind.FORCED
    assert stopped_how(trapped) is StopKind.GRACEFUL
    assert stopped_how(running) is None
    assert pods_started([killed, running, trapped]) == at(1)
    assert pods_started([pod({"waiting": {"reason": "ContainerCreating"}})]) is None


@pytest.mark.parametrize(
    ("state", "signal", "start", "how"),
    [
        ("CANCELLED", 9, 100, StopKind.FORCED),
        ("CANCELLED", 15, 100, StopKind.GRACEFUL),
        ("CANCELLED", None, None, None),  # cancelled before it ran: nothing was stopped
        ("TIMEOUT", 9, 100, StopKind.FORCED),
        ("TIMEOUT", None, 100, StopKind.GRACEFUL),
    ],
)
def test_slurm_says_how_a_stop_went(
    state: str, signal: int | None, start: int | None, how: StopKind | None
) -> None:
    from dispatch._backends.slurm._classify import classify
    from dispatch._backends.slurm._dialects import SlurmJob

    c = classify(SlurmJob(job_id=1, state=state, signal=signal, start_time=start))
    assert c.stop is how
    assert c.cause is not None
    assert c.cause.stop is how

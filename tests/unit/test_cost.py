"""What recovery cost: the core's arithmetic (:mod:`dispatch._cost`) on records moved through the
protocol by :func:`decide` and :func:`apply`, against figures worked out from the script of what the
scheduler did; the start folded into the write that records an end; the operator's metrics
counting each recovery once, a restart included; the status the operator writes and the plugin
shows."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from dispatch import (
    Cause,
    CauseKind,
    Cost,
    JobSpec,
    ObjectView,
    Phase,
    Record,
    RecoveryPolicy,
    Rule,
    State,
    status,
)
from dispatch._backends.kubeflow import KubeflowOptions
from dispatch._backends.kubeflow._adapter import PYTORCHJOB
from dispatch._backends.memory import MemoryBackend
from dispatch._backends.slurm._dialects import dialect_for
from dispatch._cli._render import describe_data, describe_text, failures_of, history_table
from dispatch._controller.metrics import Metrics
from dispatch._cost import failures, recovery_cost
from dispatch._decide import (
    Authorize,
    Create,
    Done,
    RecordCanonical,
    RecordEnd,
    Release,
    Wait,
    Write,
    apply,
    decide,
    due,
)
from dispatch._dispatchjob import cost_of, record_write, transitions
from dispatch._model import FAILURE_CAUSES, RULE_CAUSES, SUPERVISOR
from dispatch._plan import make_plan
from dispatch._workload import classify, project_pod
from dispatch._workload._classify import pods_started
from tests.support.kit import master_pod, pytorchjob
from tests.support.records import ADA, NOTHING_NATIVE, T0

JOB = "team-a/train"


@dataclass(frozen=True)
class Run:
    """What the scheduler does with one submission: it waits ``wait`` seconds after its release and
    runs for ``ran`` seconds, or never runs (``wait`` None: it ends while queued), then ends with
    ``cause``."""

    wait: int | None
    ran: int
    cause: CauseKind


runs = st.builds(
    Run,
    wait=st.one_of(st.none(), st.integers(0, 5000)),
    ran=st.integers(0, 100_000),
    cause=st.sampled_from(RULE_CAUSES),
)


def spec(nodes: int, gpus: int, budget: int) -> JobSpec:
    rule = Rule(on=RULE_CAUSES, budget=budget)
    options = KubeflowOptions(image="example.invalid/train:1", resources={"gpu": gpus})
    return JobSpec(
        name="train",
        command=("train",),
        nodes=nodes,
        recovery=RecoveryPolicy(rules=(rule,)),
        kubeflow=options,
    )


def new(nodes: int = 1, gpus: int = 0, budget: int = 100) -> Record:
    s = spec(nodes, gpus, budget)
    return Record(
        job=JOB,
        spec=s,
        plan=make_plan("train", s, NOTHING_NATIVE, supervised=True),
        submitted_by=ADA,
        submitted_at=T0,
        supervised=True,
    )


@dataclass
class Played:
    record: Record
    objects: list[ObjectView]
    starts: dict[int, datetime]
    """Submission -> when it began running."""
    ends: dict[int, datetime]
    """Submission -> when its end was recorded."""


def play(script: list[Run], last: CauseKind = CauseKind.NONE, nodes: int = 1, gpus: int = 0) -> Played:
    """Move a record through the protocol as the supervisor does, the scheduler doing ``script``
    (then ``last`` for the final submission): every write at the scheduler's time."""
    record = new(nodes, gpus, budget=len(script))  # the last submission's failure fails the job
    objects: dict[str, ObjectView] = {}
    starts: dict[int, datetime] = {}
    ends: dict[int, datetime] = {}
    plays = [*script, Run(wait=1, ran=60, cause=last)]
    now = T0
    for _ in range(10_000):
        decision = decide(record, tuple(objects.values()))
        step = decision.step
        if isinstance(step, Done):
            break
        if isinstance(step, Write):
            before = record.current
            record = apply(record, step, actor=SUPERVISOR, now=now)
            if before is not None and before.cause is None and record.submissions[before.n - 1].cause:
                ends[before.n] = now
        elif isinstance(step, Create):
            oid = str(step.submission)
            objects[oid] = ObjectView(id=oid, job=JOB, submission=step.submission, phase=Phase.HELD)
        elif isinstance(step, Release):
            objects[step.object_id] = objects[step.object_id].model_copy(update={"phase": Phase.QUEUED})
        elif isinstance(step, Wait):
            cur = record.current
            assert cur is not None
            assert cur.canonical is not None
            view = objects[cur.canonical]
            run = plays[cur.n - 1]
            if view.phase is Phase.QUEUED and run.wait is not None:
                now += timedelta(seconds=run.wait)
                starts[cur.n] = now
                update = {"phase": Phase.RUNNING, "started_at": now}
            else:
                now += timedelta(seconds=run.ran if view.phase is Phase.RUNNING else 30)
                update = {"phase": Phase.ENDED, "cause": Cause(kind=run.cause)}
            objects[cur.canonical] = view.model_copy(update=update)
        else:  # End: the job's outcome is recorded and an object still lives
            objects[step.object_id] = objects[step.object_id].model_copy(
                update={"phase": Phase.ENDED, "cancelled": True}
            )
    return Played(record, list(objects.values()), starts, ends)


def expected(played: Played, script: list[Run], nodes: int, gpus: int) -> Cost:
    """The figures worked out from the script, independently of dispatch._cost."""
    by_cause: dict[CauseKind, list[tuple[float, float | None]]] = {}
    for n, run in enumerate(script, start=1):
        ended = played.ends[n]
        ran = (ended - played.starts[n]).total_seconds() * nodes if n in played.starts else 0.0
        back = (played.starts[n + 1] - ended).total_seconds() if n + 1 in played.starts else None
        by_cause.setdefault(run.cause, []).append((ran, back))
    all_ = [f for kind in FAILURE_CAUSES for f in by_cause.get(kind, [])]
    return Cost(
        failures=len(all_),
        recovered=sum(1 for _, back in all_ if back is not None),
        recovery_seconds=sum(back or 0.0 for _, back in all_),
        node_seconds=sum(ran for ran, _ in all_),
        gpu_seconds=sum(ran for ran, _ in all_) * gpus,
        causes=tuple(
            {
                "cause": kind,
                "failures": len(fs),
                "recovered": sum(1 for _, back in fs if back is not None),
                "recovery_seconds": sum(back or 0.0 for _, back in fs),
                "longest_recovery_seconds": max((back for _, back in fs if back is not None), default=0.0),
                "node_seconds": sum(ran for ran, _ in fs),
                "gpu_seconds": sum(ran for ran, _ in fs) * gpus,
            }
            for kind in FAILURE_CAUSES
            if (fs := by_cause.get(kind))
        ),
    )


@settings(max_examples=150, deadline=None)
@given(
    script=st.lists(runs, max_size=8),
    nodes=st.integers(1, 16),
    gpus=st.integers(0, 8),
)
def test_the_cost_is_what_the_scheduler_did(script: list[Run], nodes: int, gpus: int) -> None:
    played = play(script, nodes=nodes, gpus=gpus)
    assert played.record.settled
    assert recovery_cost(played.record, played.objects) == expected(played, script, nodes, gpus)


@settings(max_examples=150, deadline=None)
@given(script=st.lists(runs, min_size=1, max_size=8), last=st.sampled_from([*RULE_CAUSES, CauseKind.NONE]))
def test_the_cost_outlives_the_objects(script: list[Run], last: CauseKind) -> None:
    """The start goes into the write that records the end, so a settled job's cost is the same once
    the scheduler has forgotten every object (deleted pods, Slurm's MinJobAge)."""
    played = play(script, last=last, nodes=2, gpus=1)
    assert recovery_cost(played.record, ()) == recovery_cost(played.record, played.objects)
    for sub in played.record.submissions:
        assert sub.started_at == played.starts.get(sub.n)


@settings(max_examples=100, deadline=None)
@given(script=st.lists(runs, min_size=1, max_size=8))
def test_totals_are_the_sum_of_the_causes_and_never_negative(script: list[Run]) -> None:
    cost = recovery_cost(play(script, nodes=3, gpus=2).record)
    assert [c.cause for c in cost.causes] == [
        k for k in FAILURE_CAUSES if k in {c.cause for c in cost.causes}
    ]
    assert cost.failures == sum(c.failures for c in cost.causes) == len(script)
    assert cost.recovered == sum(c.recovered for c in cost.causes)
    assert cost.node_seconds == pytest.approx(sum(c.node_seconds for c in cost.causes))
    assert cost.gpu_seconds == pytest.approx(cost.node_seconds * 2)
    assert cost.recovery_seconds == pytest.approx(sum(c.recovery_seconds for c in cost.causes))
    for c in cost.causes:
        assert 0 <= c.longest_recovery_seconds <= c.recovery_seconds
        assert c.node_seconds >= 0
        assert c.recovered <= c.failures


def test_a_recovery_ends_when_the_next_submission_runs() -> None:
    """While the next submission waits there is no time to recover yet; the scheduler's start of
    the live object ends it, before anything more is recorded."""
    played = play([Run(wait=10, ran=100, cause=CauseKind.PREEMPTED)])
    record = played.record
    first = played.ends[1]
    second = played.starts[2]
    assert (second - first).total_seconds() == 1  # the last run waits 1 s
    # The record as it was while submission 2 ran: its start not recorded yet, shown by its object.
    running = unrecorded(record, 2)
    view = ObjectView(id="2", job=JOB, submission=2, phase=Phase.RUNNING, started_at=second)
    queued = view.model_copy(update={"phase": Phase.QUEUED, "started_at": None})
    assert recovery_cost(running, [queued]).recovered == 0
    cost = recovery_cost(running, [view])
    assert (cost.recovered, cost.recovery_seconds, cost.node_seconds) == (1, 1.0, 100.0)
    assert status(running, [view]).cost == cost


def test_a_submission_that_never_ran_cost_nothing_and_recovered_nobody() -> None:
    """Submission 2 never runs: the failure of 1 is not recovered by it (its time to recover is
    that of the next submission to run, which is another failure's), and 2 cost no node-seconds."""
    played = play(
        [Run(wait=5, ran=50, cause=CauseKind.NODE_LOST), Run(wait=None, ran=0, cause=CauseKind.NO_CAPACITY)]
    )
    node, lost = failures(played.record)
    assert (node.cause, node.node_seconds, node.recovery_seconds) == (CauseKind.NODE_LOST, 50.0, None)
    assert (lost.cause, lost.node_seconds, lost.recovery_seconds) == (CauseKind.NO_CAPACITY, 0.0, 1.0)


def unrecorded(record: Record, upto: int) -> Record:
    """``record`` as it was while submission ``upto`` ran: its end, and what followed, not recorded."""
    subs = record.submissions[:upto]
    last = subs[-1].model_copy(update={"cause": None, "ended_at": None, "started_at": None})
    rules = tuple(r.model_copy(update={"firings": upto - 1}) for r in record.plan.rules)
    return record.model_copy(
        update={
            "plan": record.plan.model_copy(update={"rules": rules}),
            "submissions": (*subs[:-1], last),
            "history": record.history[: upto - 1],
            "state": State.PENDING if upto == 1 else State.RECOVERING,
            "settled": False,
        }
    )


def test_the_write_that_records_an_end_carries_the_start() -> None:
    played = play([Run(wait=3, ran=7, cause=CauseKind.PREEMPTED)])
    record = played.record
    begun = played.starts[1]
    # Submission 1's end was recorded by the authorization of 2, with its start.
    assert record.submissions[0].started_at == begun
    half = unrecorded(record, 1)
    ended = ObjectView(
        id="1",
        job=JOB,
        submission=1,
        phase=Phase.ENDED,
        cause=Cause(kind=CauseKind.PREEMPTED),
        started_at=begun,
    )
    step = decide(half, [ended]).step
    assert isinstance(step, Authorize)
    assert step.started_at == begun


# ---- the operator's metrics ------------------------------------------------------------------------


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return value or 0.0


LABELS = {"cause": "preempted", "backend": "kubeflow", "namespace": "team-a"}


def test_metrics_count_each_recovery_once_and_not_again_after_a_restart() -> None:
    played = play([Run(wait=10, ran=100, cause=CauseKind.PREEMPTED)], nodes=2, gpus=4)
    record = played.record
    before = unrecorded(record, 1)
    metrics = Metrics(CollectorRegistry())
    metrics.costs("kubeflow", before, ())  # first sight: nothing failed yet
    for _ in range(3):  # every decision after it shows the same: counted once
        metrics.costs("kubeflow", record, played.objects)
    assert sample(metrics, "dispatch_failed_node_seconds_total", **LABELS) == 200.0
    assert sample(metrics, "dispatch_failed_gpu_seconds_total", **LABELS) == 800.0
    assert sample(metrics, "dispatch_recovery_seconds_count", **LABELS) == 1.0
    assert sample(metrics, "dispatch_recovery_seconds_sum", **LABELS) == 1.0

    restarted = Metrics(CollectorRegistry())  # a new process (or leader) sees the job first now
    restarted.costs("kubeflow", record, played.objects)
    restarted.costs("kubeflow", record, played.objects)
    assert sample(restarted, "dispatch_failed_node_seconds_total", **LABELS) == 0.0
    assert sample(restarted, "dispatch_recovery_seconds_count", **LABELS) == 0.0


def test_metrics_count_the_seconds_at_the_end_and_the_recovery_when_the_next_runs() -> None:
    played = play([Run(wait=10, ran=100, cause=CauseKind.PREEMPTED)])
    record = played.record
    metrics = Metrics(CollectorRegistry())
    metrics.costs("kubeflow", unrecorded(record, 1), ())
    # Submission 1's end recorded, 2 authorized and queued: its seconds, no recovery yet.
    queued = unrecorded(record, 2)
    view = ObjectView(id="2", job=JOB, submission=2, phase=Phase.QUEUED)
    metrics.costs("kubeflow", queued, [view])
    assert sample(metrics, "dispatch_failed_node_seconds_total", **LABELS) == 100.0
    assert sample(metrics, "dispatch_recovery_seconds_count", **LABELS) == 0.0
    running = view.model_copy(update={"phase": Phase.RUNNING, "started_at": played.starts[2]})
    metrics.costs("kubeflow", queued, [running])
    metrics.costs("kubeflow", record, played.objects)  # and its success changes nothing
    assert sample(metrics, "dispatch_failed_node_seconds_total", **LABELS) == 100.0
    assert sample(metrics, "dispatch_recovery_seconds_count", **LABELS) == 1.0
    metrics.forget(JOB)
    assert JOB not in metrics._costed


# ---- the status the operator writes, and the plugin ------------------------------------------------


def dispatchjob_of(record: Record, status: dict[str, object]) -> dict[str, object]:
    """The DispatchJob of ``record`` (a Kubeflow job of team-a) with ``status``."""
    spec = record.spec
    return {
        "metadata": {"name": spec.name, "namespace": "team-a"},
        "spec": {
            "backend": "kubeflow",
            "command": list(spec.command),
            "nodes": spec.nodes,
            "recovery": spec.recovery.model_dump(mode="json", by_alias=True, exclude_none=True),
            "kubeflow": spec.options["kubeflow"].model_dump(
                mode="json", by_alias=True, exclude_defaults=True
            ),
        },
        "status": status,
    }


def test_the_status_holds_the_cost_and_describe_shows_it() -> None:
    played = play(
        [Run(wait=10, ran=100, cause=CauseKind.PREEMPTED), Run(wait=20, ran=40, cause=CauseKind.NODE_LOST)],
        nodes=2,
        gpus=8,
    )
    written = record_write(played.record, previous=(), generation=1, now=T0, observed={})
    assert written["cost"]["nodeSeconds"] == 280.0
    assert written["cost"]["causes"][0]["cause"] == "preempted"
    body = dispatchjob_of(played.record, written)
    assert cost_of(body) == recovery_cost(played.record)
    text = describe_text(describe_data(body))
    assert "Recovery cost:" in text
    assert "preempted" in text.split("Recovery cost:")[1]
    assert "2240" in text  # GPU-seconds: 280 node-s x 8
    # The history says what each failure cost, on the transition that recorded it.
    lines = history_table(transitions(body), failures_of(body)).splitlines()
    assert "COST" in lines[0]
    assert lines[1].endswith("200 node-s, 1600 GPU-s, running again after 20 s")
    assert lines[2].endswith("80 node-s, 640 GPU-s, running again after 1 s")
    assert lines[3].endswith("supervisor:supervisor   -")  # the success cost nothing
    # A job that never failed has no cost in its status.
    clean = play([])
    assert "cost" not in record_write(clean.record, previous=(), generation=1, now=T0, observed={})


# ---- when an object began running, as each backend says it -----------------------------------------


def running_pod(started: str, *, since: str | None = None) -> dict[str, object]:
    """A master pod of team/train-1 running since ``started`` (its container's start), restarted
    in place once when ``since`` (the previous run's start) is given."""
    container: dict[str, object] = {
        "name": "pytorch",
        "restartCount": 0,
        "state": {"running": {"startedAt": started}},
    }
    if since is not None:
        container["lastState"] = {"terminated": {"exitCode": 1, "startedAt": since}}
    status = {"phase": "Running", "startTime": "2026-12-01T11:59:00Z", "containerStatuses": [container]}
    return master_pod("pod-1", "20", "kwok-node-0", status)


def test_the_kit_says_when_the_earliest_pod_began_running_and_keeps_it() -> None:
    body = pytorchjob(ended=False)
    worker = project_pod(running_pod("2026-12-01T12:01:05Z"))  # as the kit caches a pod
    master = project_pod(running_pod("2026-12-01T12:01:00Z"))
    view = classify(PYTORCHJOB, body, [worker, master], now=1.8e9).view
    assert view.phase is Phase.RUNNING
    assert view.started_at == datetime(2026, 12, 1, 12, 1, tzinfo=UTC)
    # Restarted in place: the first run's start, from the container's last state.
    again = project_pod(running_pod("2026-12-01T12:03:00Z", since="2026-12-01T12:01:00Z"))
    assert pods_started([again]) == datetime(2026, 12, 1, 12, 1, tzinfo=UTC)
    # A pod that runs but whose containers say nothing yet: its own startTime.
    bare = master_pod("pod-2", "21", "kwok-node-0", {"phase": "Running", "startTime": "2026-12-01T11:59:00Z"})
    assert classify(PYTORCHJOB, body, [bare], now=1.8e9).view.started_at == datetime(
        2026, 12, 1, 11, 59, tzinfo=UTC
    )
    # Pending pods have not run; an ended object whose pods are gone shows the start the adapter kept.
    pending = master_pod("pod-3", "22", "", {"phase": "Pending"})
    assert classify(PYTORCHJOB, body, [pending], now=1.8e9).view.started_at is None
    kept = datetime(2026, 12, 1, 12, 1, tzinfo=UTC)
    ended = classify(PYTORCHJOB, pytorchjob(), [], now=1.8e9, started=kept).view
    assert (ended.phase, ended.started_at) == (Phase.ENDED, kept)


def test_slurm_says_when_a_job_began_running_never_its_estimate() -> None:
    dialect = dialect_for("v0.0.40")
    rec = {"job_id": 7, "job_state": ["RUNNING"], "start_time": {"set": True, "number": 1_800_000_000}}
    assert dialect.parse_job(rec).started() == 1_800_000_000
    pending = {**rec, "job_state": ["PENDING"]}  # its start_time is when Slurm expects to start it
    assert dialect.parse_job(pending).started() is None
    old = dialect_for("v0.0.38").parse_job(
        {"job_id": 7, "job_state": "PREEMPTED", "start_time": 1_800_000_000}
    )
    assert old.started() == 1_800_000_000


async def test_the_memory_backend_says_when_an_object_began_running() -> None:
    at = T0 + timedelta(seconds=42)
    backend = MemoryBackend(clock=lambda: at)
    oid = await backend.create(JOB, 1, spec(1, 0, 1), new().plan)
    await backend.release(oid)
    (queued,) = await backend.list(JOB)
    assert queued.started_at is None
    backend.env.run(oid)
    backend.env.preempt(oid)
    (ended,) = await backend.list(JOB)
    assert (ended.phase, ended.started_at) == (Phase.ENDED, at)


def test_a_backoff_records_the_start_with_the_end_and_keeps_it() -> None:
    """With a backoff the end is recorded first (RecordEnd) and the next submission authorized
    later: the start goes into the first write and stays through the second."""
    backoff = Rule(on=(CauseKind.PREEMPTED,), budget=1, backoff={"base_seconds": 30})
    s = JobSpec(name="train", command=("train",), recovery=RecoveryPolicy(rules=(backoff,)))
    record = Record(
        job=JOB,
        spec=s,
        plan=make_plan("train", s, NOTHING_NATIVE, supervised=True),
        submitted_by=ADA,
        submitted_at=T0,
        supervised=True,
    )
    record = apply(record, Authorize(1), actor=SUPERVISOR, now=T0)
    record = apply(record, RecordCanonical(1, "1"), actor=SUPERVISOR, now=T0)
    began, ended_at = T0 + timedelta(seconds=5), T0 + timedelta(seconds=65)
    view = ObjectView(
        id="1",
        job=JOB,
        submission=1,
        phase=Phase.ENDED,
        cause=Cause(kind=CauseKind.PREEMPTED),
        started_at=began,
    )
    end = decide(record, [view]).step
    assert isinstance(end, RecordEnd)
    record = apply(record, end, actor=SUPERVISOR, now=ended_at)
    waited = due(decide(record, []), ended_at + timedelta(seconds=30)).step  # the object is gone
    assert isinstance(waited, Authorize)
    record = apply(record, waited, actor=SUPERVISOR, now=ended_at + timedelta(seconds=30))
    first = record.submissions[0]
    assert (first.started_at, first.ended_at) == (began, ended_at)
    assert recovery_cost(record).node_seconds == 60.0

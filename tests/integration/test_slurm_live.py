"""The Slurm bridge against a real Slurm 22.05 + slurmrestd (API v0.0.38), started by the fixture."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import pytest

from dispatch import SlurmOptions
from dispatch._backends.slurm._adapter import SlurmBackend, open_adapter
from dispatch._cluster import compose
from dispatch._errors import PlanError
from dispatch._model import (
    Action,
    Capabilities,
    CauseKind,
    Enforcer,
    JobSpec,
    ObjectView,
    Phase,
    Plan,
    PlannedRule,
    RecoveryPolicy,
    Rule,
    State,
    StopKind,
    StopPolicy,
    WarningSignal,
)
from dispatch._plan import make_plan
from tests.support.builders import ALICE
from tests.support.slurmlab import SlurmLab

pytestmark = [pytest.mark.integration, pytest.mark.slurm]


@pytest.fixture
async def backend(slurm: SlurmLab) -> AsyncIterator[SlurmBackend]:
    b = open_adapter(slurm.backend_config(poll_interval=0.25))
    try:
        yield b
    finally:
        await b.aclose()


def spec(
    name: str, *command: str, stop: StopPolicy | None = None, limit: int | None = None, **slurm_opts: object
) -> JobSpec:
    return JobSpec(
        name=name,
        command=command,
        time_limit_seconds=limit,
        stop=stop or StopPolicy(),
        slurm=SlurmOptions.model_validate(slurm_opts),
    )


def plan(name: str) -> Plan:
    return Plan(job=name)


async def wait_view(
    b: SlurmBackend, job: str, object_id: str, pred: Callable[[ObjectView], bool], within: float, what: str
) -> ObjectView:
    deadline = time.monotonic() + within
    last: ObjectView | None = None
    while time.monotonic() < deadline:
        views = {v.id: v for v in await b.list(job)}
        last = views.get(object_id)
        if last is not None and pred(last):
            return last
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out after {within}s waiting for {what}; last view {last}")


def ended(v: ObjectView) -> bool:
    return v.phase is Phase.ENDED


def running(v: ObjectView) -> bool:
    return v.phase is Phase.RUNNING


async def test_held_submit_release_complete(slurm: SlurmLab, backend: SlurmBackend) -> None:
    oid = await backend.create("ok", 1, spec("ok", "bash", "-c", "echo hello; sleep 1"), plan("ok"))
    [view] = await backend.list("ok")
    assert (view.id, view.job, view.submission, view.phase) == (oid, "ok", 1, Phase.HELD)
    rec = slurm.job_state(oid)
    assert (rec["JobState"], rec["Reason"]) == ("PENDING", "JobHeldUser"), rec
    assert (rec["JobName"], rec.get("Requeue")) == ("dispatch-ok-1", "0"), rec
    await asyncio.sleep(2)  # a held job never starts
    assert slurm.job_state(oid)["JobState"] == "PENDING"
    assert (await backend.list("ok"))[0].phase is Phase.HELD

    await backend.release(oid)
    assert (await backend.list("ok"))[0].phase in (Phase.QUEUED, Phase.RUNNING)
    view = await wait_view(backend, "ok", oid, ended, 60, "completion")
    assert view.cause is not None
    assert view.cause.kind is CauseKind.NONE
    assert view.cause.exit_code == 0
    assert not view.cancelled
    assert view.restarts == 0


async def test_a_released_job_that_waits_for_the_node_says_slurms_reason(backend: SlurmBackend) -> None:
    """The node's two CPUs taken by a first job: the second, released, waits, and its view says why
    as squeue would (status's ``observedNote`` in the operator), not just ``queued``."""
    first = await backend.create("busy", 1, spec("busy", "sleep", "60", cpus_per_task=2), plan("busy"))
    await backend.release(first)
    await wait_view(backend, "busy", first, running, 60, "the first job running")
    second = await backend.create("waits", 1, spec("waits", "true", cpus_per_task=2), plan("waits"))
    await backend.release(second)
    view = await wait_view(backend, "waits", second, lambda v: bool(v.waiting), 30, "Slurm's reason")
    assert view.phase is Phase.QUEUED, view
    assert view.waiting.startswith("pending in Slurm: reason "), view.waiting
    assert view.waiting.split("reason ")[1].split()[0] in ("Resources", "Priority"), view.waiting


async def test_non_zero_exit(backend: SlurmBackend) -> None:
    oid = await backend.create("nz", 1, spec("nz", "bash", "-c", "exit 3"), plan("nz"))
    await backend.release(oid)
    view = await wait_view(backend, "nz", oid, ended, 60, "failure")
    assert view.cause is not None
    assert view.cause.kind is CauseKind.NON_ZERO_EXIT
    assert view.cause.exit_code == 3
    assert "NonZeroExitCode" in view.cause.detail


async def test_launch_failed_missing_working_directory(backend: SlurmBackend) -> None:
    oid = await backend.create("lf", 1, spec("lf", "true", working_directory="/nonexistent/dir"), plan("lf"))
    await backend.release(oid)
    view = await wait_view(backend, "lf", oid, ended, 60, "launch failure")
    assert view.cause is not None, view
    assert view.cause.kind is CauseKind.LAUNCH_FAILED, view


async def test_killed_by_signal_is_unknown(backend: SlurmBackend) -> None:
    oid = await backend.create("sig", 1, spec("sig", "bash", "-c", "kill -9 $$"), plan("sig"))
    await backend.release(oid)
    view = await wait_view(backend, "sig", oid, ended, 60, "kill")
    assert view.cause is not None, view
    assert view.cause.kind is CauseKind.UNKNOWN, view
    assert "SIGKILL" in view.cause.detail


@pytest.mark.timeout(200)
async def test_time_limit(slurm: SlurmLab, backend: SlurmBackend) -> None:
    # Slurm's smallest limit is one minute and it checks limits about every 30 s: ~60-90 s.
    oid = await backend.create("tl", 1, spec("tl", "sleep", "600", limit=60), plan("tl"))
    await backend.release(oid)
    start = await wait_view(backend, "tl", oid, running, 60, "running")
    assert start.started_at is not None, start
    view = await wait_view(backend, "tl", oid, ended, 170, "time limit")
    assert view.cause is not None, view
    assert view.cause.kind is CauseKind.TIME_LIMIT, view
    assert view.stop is not None, view


TRAPS = "trap 'exit {code}' {signal}; sleep 600 & wait"
"""A program that exits with ``code`` when ``signal`` reaches it: its exit status says it saw it."""


@pytest.mark.timeout(200)
async def test_the_warning_signal_reaches_the_program_before_the_time_limit(backend: SlurmBackend) -> None:
    """``--signal=B:USR1@50`` on a one-minute limit: the trap exits 42 long before Slurm's TIMEOUT."""
    warned = StopPolicy(warning_seconds=50, warning_signal=WarningSignal.SIGUSR1)
    script = TRAPS.format(code=42, signal="USR1")
    oid = await backend.create(
        "warn", 1, spec("warn", "bash", "-c", script, limit=60, stop=warned), plan("warn")
    )
    await backend.release(oid)
    view = await wait_view(backend, "warn", oid, ended, 170, "the warning")
    assert view.cause is not None, view
    assert (view.cause.kind, view.cause.exit_code) == (CauseKind.NON_ZERO_EXIT, 42), view


async def test_a_stop_gives_sigterm_before_sigkill(backend: SlurmBackend) -> None:
    """scancel: SIGTERM reaches the program, which exits within KillWait (graceful)."""
    oid = await backend.create(
        "term", 1, spec("term", "bash", "-c", TRAPS.format(code=43, signal="TERM")), plan("term")
    )
    await backend.release(oid)
    await wait_view(backend, "term", oid, running, 60, "running")
    await asyncio.sleep(1)  # (bash sets its trap first)
    await backend.end(oid)
    view = await wait_view(backend, "term", oid, ended, 60, "the stop")
    assert view.cause is not None, view
    assert view.stop is StopKind.GRACEFUL, view
    assert view.cause.signal != 9, view


async def test_a_program_that_ignores_sigterm_is_killed_and_the_stop_is_forced(backend: SlurmBackend) -> None:
    oid = await backend.create(
        "deaf", 1, spec("deaf", "bash", "-c", "trap '' TERM; sleep 600 & wait"), plan("deaf")
    )
    await backend.release(oid)
    await wait_view(backend, "deaf", oid, running, 60, "running")
    await asyncio.sleep(1)
    await backend.end(oid)
    view = await wait_view(backend, "deaf", oid, ended, 90, "the kill")
    assert view.stop is StopKind.FORCED, view


async def start_whole_node_job(b: SlurmBackend, name: str, partition: str, p: Plan | None = None) -> str:
    oid = await b.create(
        name, 1, spec(name, "sleep", "300", partition=partition, cpus_per_task=2), p or plan(name)
    )
    await b.release(oid)
    await wait_view(b, name, oid, running, 60, f"{name} running")
    return oid


async def test_preemption_cancel_mode(slurm: SlurmLab, backend: SlurmBackend) -> None:
    oid = await start_whole_node_job(backend, "pc", "lowcxl")
    slurm.submit_blocker("high")
    view = await wait_view(backend, "pc", oid, ended, 60, "preemption")
    assert view.cause is not None, view
    assert view.cause.kind is CauseKind.PREEMPTED, view
    assert not view.cancelled
    assert view.restarts == 0


def test_capabilities_are_empty_and_a_restart_rule_is_refused(backend: SlurmBackend) -> None:
    # Slurm enforces no rule exactly: MaxBatchRequeue (compiled in as 5 in 22.05) is not checked on
    # preemption requeues, and the requeue flag cannot allow node-failure requeues alone.
    assert backend.capabilities == Capabilities()
    both = (CauseKind.PREEMPTED, CauseKind.NODE_LOST)
    for on in (both, (CauseKind.PREEMPTED,), (CauseKind.NODE_LOST,)):
        s = JobSpec(
            name="rs",
            command=("true",),
            recovery=RecoveryPolicy(rules=(Rule(on=on, action=Action.RESTART, budget=5),)),
        )
        with pytest.raises(PlanError) as caught:
            make_plan("rs", s, backend.capabilities, supervised=True)
        assert caught.value.rule == 0
        assert "only a scheduler can restart in place" in str(caught.value)
        assert "(it enforces nothing)" in str(caught.value)


def requeue_rule_spec(name: str, command: tuple[str, ...]) -> JobSpec:
    """What a Slurm user would write for preemption and node loss: the supervisor's rule."""
    return JobSpec(
        name=name,
        command=command,
        recovery=RecoveryPolicy(
            rules=(Rule(on=(CauseKind.PREEMPTED, CauseKind.NODE_LOST), action=Action.RESUBMIT, budget=5),)
        ),
        slurm=SlurmOptions(partition="low", cpus_per_task=2),
    )


async def test_preemption_requeue_mode_ends_preempted(slurm: SlurmLab, backend: SlurmBackend) -> None:
    # REQUEUE partition, and a rule on preemption: still the supervisor's, so the job is submitted
    # no_requeue and a REQUEUE-mode preemption ends it PREEMPTED instead of requeueing it in place.
    s = requeue_rule_spec("pr", ("sleep", "300"))
    p = make_plan("pr", s, backend.capabilities, supervised=True)
    assert p.rules[0].enforcer is Enforcer.SUPERVISOR
    oid = await backend.create("pr", 1, s, p)
    assert slurm.job_state(oid).get("Requeue") == "0"
    await backend.release(oid)
    await wait_view(backend, "pr", oid, running, 60, "running")
    slurm.submit_blocker("high")
    view = await wait_view(backend, "pr", oid, ended, 60, "preemption")
    assert view.cause is not None, view
    assert view.cause.kind is CauseKind.PREEMPTED, view
    assert (view.cancelled, view.restarts) == (False, 0), view
    rec = slurm.job_state(oid)
    assert (rec.get("JobState"), rec.get("Restarts")) == ("PREEMPTED", "0"), rec


async def test_preemption_requeue_mode_recovered_by_the_supervisor(slurm: SlurmLab) -> None:
    backend = open_adapter(slurm.backend_config(poll_interval=0.25))
    cluster = compose(backend)
    try:
        p = await cluster.operator.submit(requeue_rule_spec("rq", ("sleep", "3")), ALICE, supervised=True)
        assert p.rules[0].enforcer is Enforcer.SUPERVISOR
        run = asyncio.create_task(cluster.supervisor().run("rq"))
        deadline = time.monotonic() + 60
        while not any(v.phase is Phase.RUNNING for v in await backend.list("rq")):
            assert time.monotonic() < deadline, "submission 1 never ran"
            assert not run.done()
            await asyncio.sleep(0.2)
        slurm.submit_blocker("high", seconds=3)  # preempts submission 1 (PreemptMode=REQUEUE)
        record = await asyncio.wait_for(run, 120)
    finally:
        await cluster.aclose()
    history = [(t.from_, t.to, t.submission) for t in record.history]
    assert history == [(State.PENDING, State.RECOVERING, 2), (State.RECOVERING, State.SUCCEEDED, 2)]
    assert record.history[0].cause.kind is CauseKind.PREEMPTED
    assert (record.state, record.settled, record.plan.rules[0].firings) == (State.SUCCEEDED, True, 1)
    assert [(s.cause.kind if s.cause else None, s.restarts) for s in record.submissions] == [
        (CauseKind.PREEMPTED, 0),
        (CauseKind.NONE, 0),
    ]
    first, second = (str(s.canonical) for s in record.submissions)
    assert first != second
    assert slurm.job_state(first).get("Restarts") in ("0", None)


async def test_node_down(slurm: SlurmLab, backend: SlurmBackend) -> None:
    oid = await backend.create("nd", 1, spec("nd", "sleep", "300"), plan("nd"))
    await backend.release(oid)
    await wait_view(backend, "nd", oid, running, 60, "running")
    slurm.set_node_state("down", "dispatch-test")
    view = await wait_view(backend, "nd", oid, ended, 60, "node failure")
    assert view.cause is not None, view
    assert view.cause.kind is CauseKind.NODE_LOST, view


async def test_cancel_by_dispatch_and_from_outside(slurm: SlurmLab, backend: SlurmBackend) -> None:
    mine = await backend.create("cx", 1, spec("cx", "sleep", "300"), plan("cx"))
    theirs = await backend.create("cx", 2, spec("cx", "sleep", "300"), plan("cx"))
    await backend.release(mine)
    await backend.release(theirs)
    await wait_view(backend, "cx", mine, running, 60, "running")
    await backend.end(mine)
    slurm.scancel(theirs)
    a = await wait_view(backend, "cx", mine, ended, 60, "dispatch cancel")
    b = await wait_view(backend, "cx", theirs, ended, 60, "outside cancel")
    assert a.cancelled
    assert b.cancelled
    assert mine in backend.ended_by_dispatch
    assert theirs not in backend.ended_by_dispatch
    await backend.end(mine)  # idempotent
    await backend.end("999999")  # a job Slurm never had


async def test_crash_between_submit_and_record_leaves_held_orphan(slurm: SlurmLab) -> None:
    first = open_adapter(slurm.backend_config())
    orphan = await first.create("crash", 1, spec("crash", "true"), plan("crash"))
    await first.aclose()  # the supervisor dies before recording the canonical id
    await asyncio.sleep(1.5)
    assert slurm.job_state(orphan)["JobState"] == "PENDING"  # held: it can never run

    second = open_adapter(slurm.backend_config())
    try:
        assert (await second.dialect()).version == slurm.api_version  # asks the server, newest first
        before = second.rest.requests
        views = await second.list("crash")
        assert second.rest.requests - before == 1  # one GET /jobs finds it by its tag
        assert [(v.id, v.phase) for v in views] == [(orphan, Phase.HELD)]
        await second.end(orphan)
        view = await wait_view(second, "crash", orphan, ended, 30, "orphan cancelled")
        assert view.cancelled
    finally:
        await second.aclose()


@pytest.mark.timeout(200)
async def test_final_state_outlives_min_job_age(slurm: SlurmLab, backend: SlurmBackend) -> None:
    oid = await backend.create("age", 1, spec("age", "true"), plan("age"))
    await backend.release(oid)
    unsub = backend.subscribe("age", lambda: None)  # keep the shared poller running
    try:
        view = await wait_view(backend, "age", oid, ended, 60, "completion")
        assert view.cause is not None
        assert view.cause.kind is CauseKind.NONE
        # Slurm forgets the job MinJobAge (10 s here) after it ends, on its next purge pass.
        slurm.wait_for(lambda: not slurm.job_state(oid), 150, "Slurm to forget the job", interval=2)
        await asyncio.sleep(1)
        [again] = await backend.list("age")
        assert again == view  # remembered, not turned into 'vanished'
    finally:
        unsub()
    fresh = open_adapter(slurm.backend_config())
    try:
        assert await fresh.list("age") == []  # a new process cannot know: the record's canonical is missing
    finally:
        await fresh.aclose()


def test_planned_rule_model_is_what_we_expect() -> None:
    # Guard against drift of the core model this module builds plans with.
    r = PlannedRule(
        index=0, on=(CauseKind.PREEMPTED,), action=Action.RESUBMIT, budget=2, enforcer=Enforcer.SUPERVISOR
    )
    assert r.left == 2

"""The cluster facade, the seed's example end to end, and the pinned public surface."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tomllib
from importlib.resources import files
from pathlib import Path

import pytest

import dispatch
from dispatch import (
    Action,
    Actor,
    ActorKind,
    AdapterNotFound,
    CauseKind,
    Enforcer,
    JobExists,
    JobNotFound,
    JobSpec,
    MemoryBackend,
    MemoryStore,
    Phase,
    PlanError,
    RecoveryPolicy,
    Rule,
    Shape,
    State,
    Status,
    Supervisor,
    compose,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "supervise_a_job.py"
ADA = Actor(kind=ActorKind.HUMAN, id="ada")
BOB = Actor(kind=ActorKind.HUMAN, id="bob")

SEED_OUTPUT = """\
rule 0 is enforced by the supervisor
uncovered: [node-lost out-of-memory time-limit non-zero-exit launch-failed no-capacity requeued unknown]
running as submission 1
running as submission 2 after 1 firing of rule 0
succeeded with cause none
  pending -> recovering (submission 2)
  recovering -> succeeded (submission 2)
"""

REFUSAL = (
    "refused: rule 0 cannot be enforced: the scheduler does not enforce resubmit on [preempted] "
    "with budget 2 natively (it enforces nothing) and no supervisor will run\n"
)


def run_example(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLE), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )


def test_the_example_prints_exactly_the_seed_lines() -> None:
    done = run_example()
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert done.stdout == SEED_OUTPUT


def test_the_example_without_a_supervisor_prints_the_refusal() -> None:
    done = run_example("--no-supervisor")
    assert done.returncode == 0, done.stderr
    assert done.stdout == REFUSAL


def seed_spec(name: str = "finetune") -> JobSpec:
    return JobSpec(
        name=name,
        command=("torchrun", "train.py"),
        nodes=2,
        recovery=RecoveryPolicy(rules=(Rule(on=(CauseKind.PREEMPTED,), action=Action.RESUBMIT, budget=2),)),
    )


async def test_submit_supervise_watch_recover_and_succeed() -> None:
    backend = MemoryBackend(Shape.SLURM, auto_run=True)
    cluster = compose(backend)
    plan = await cluster.operator.submit(seed_spec(), ADA, supervised=True)
    assert plan.rules[0].enforcer is Enforcer.SUPERVISOR
    assert await backend.list(plan.job) == []  # submit launches nothing when a supervisor will run
    record, _ = await cluster.store.get(plan.job)
    assert (record.submitted_by, record.supervised, record.state) == (ADA, True, State.PENDING)

    supervisor = cluster.supervisor()
    done = asyncio.create_task(supervisor.run(plan.job))
    seen: list[Status] = []
    async with asyncio.timeout(10):
        async for st in cluster.observer.watch(plan.job, poll_interval=0.5):
            seen.append(st)
            if st.state is State.RUNNING and len(st.submissions) == 1:
                canonical = st.submissions[0].canonical
                assert canonical is not None
                backend.env.preempt(canonical)
            elif st.state is State.RUNNING and len(st.submissions) == 2:
                canonical = st.submissions[1].canonical
                assert canonical is not None
                backend.env.complete(canonical)
        settled = await done

    states = [s.state for s in seen]
    assert State.FAILED not in states
    first_run = states.index(State.RUNNING)
    second_run = next(i for i, s in enumerate(seen) if s.state is State.RUNNING and len(s.submissions) == 2)
    between = seen[first_run + 1 : second_run]
    assert between
    assert all(s.state is State.RECOVERING and s.cause.kind is CauseKind.PREEMPTED for s in between)
    assert any(len(s.submissions) == 1 for s in between)  # recovering before submission 2 is authorized
    assert seen[-1].settled
    assert seen[-1].state is State.SUCCEEDED
    assert settled.settled

    final = await cluster.observer.get(plan.job)
    assert final == seen[-1]
    assert final.plan.rules[0].firings == 1
    assert [(t.from_, t.to, t.submission) for t in final.history] == [
        (State.PENDING, State.RECOVERING, 2),
        (State.RECOVERING, State.SUCCEEDED, 2),
    ]
    assert final.message.startswith("settled")
    await cluster.aclose()


async def test_cancel_through_the_operator_records_who_cancelled() -> None:
    backend = MemoryBackend(Shape.KUBEFLOW, auto_run=True)
    cluster = compose(backend, store=MemoryStore())
    plan = await cluster.operator.submit(seed_spec(), ADA, supervised=True)
    supervisor = Supervisor(backend, cluster.store, poll_interval=0.5)
    await supervisor.drive(plan.job)
    assert (await cluster.observer.get(plan.job)).state is State.RUNNING
    done = asyncio.create_task(supervisor.run(plan.job))
    await cluster.operator.cancel(plan.job, BOB)
    async with asyncio.timeout(10):
        record = await done
    assert (record.state, record.settled) == (State.CANCELLED, True)
    assert record.history[-1].actor == BOB
    assert record.history[-1].from_ is State.PENDING
    assert record.cancel is not None
    assert record.cancel.actor == BOB
    assert all(o.phase is Phase.ENDED for o in await backend.list(plan.job))
    # cancelling again is harmless and changes nothing
    await cluster.operator.cancel(plan.job, ADA)
    again, _ = await cluster.store.get(plan.job)
    assert again == record


async def test_the_store_refuses_a_second_job_of_the_same_name_and_unknown_jobs() -> None:
    cluster = compose(MemoryBackend())
    await cluster.operator.submit(seed_spec(), ADA, supervised=True)
    with pytest.raises(JobExists):
        await cluster.operator.submit(seed_spec(), ADA, supervised=True)
    with pytest.raises(JobNotFound, match="no record for job 'nope'"):
        await cluster.observer.get("nope")


async def test_submit_without_a_supervisor_refuses_and_records_nothing() -> None:
    backend = MemoryBackend(Shape.SLURM, auto_run=True)
    cluster = compose(backend)
    with pytest.raises(PlanError) as caught:
        await cluster.operator.submit(seed_spec(), ADA)
    assert caught.value.rule == 0
    with pytest.raises(JobNotFound):
        await cluster.store.get("finetune")
    assert backend.objects() == []


async def test_an_unsupervised_job_with_only_scheduler_rules_is_launched_by_submit() -> None:
    backend = MemoryBackend(Shape.KUBEFLOW, auto_run=True)
    cluster = compose(backend)
    restart = Rule(on=(CauseKind.NON_ZERO_EXIT, CauseKind.OUT_OF_MEMORY), action=Action.RESTART, budget=5)
    spec = JobSpec(name="native", command=("train",), recovery=RecoveryPolicy(rules=(restart,)))
    plan = await cluster.operator.submit(spec, ADA, supervised=False)
    assert plan.rules[0].enforcer is Enforcer.SCHEDULER
    (view,) = await backend.list("native")
    assert view.phase is Phase.RUNNING
    assert backend.ever_released(view.id)
    st = await cluster.observer.get("native")
    assert st.state is State.RUNNING
    assert st.submissions[0].canonical == view.id
    record, _ = await cluster.store.get("native")
    assert record.submissions[0].authorized_by == ADA  # the submitter launched it

    backend.env.out_of_memory(view.id)  # restarted in place by the scheduler
    assert (await cluster.observer.get("native")).state is State.RUNNING

    # nobody supervises it, so the canceller drives it to settled
    await cluster.operator.cancel("native", BOB)
    record, _ = await cluster.store.get("native")
    assert (record.state, record.settled) == (State.CANCELLED, True)
    assert all(o.phase is Phase.ENDED for o in await backend.list("native"))


async def test_the_watch_of_an_unsupervised_job_ends_when_its_restarted_object_ends() -> None:
    """Nobody records the scheduler's restarts of a job nobody supervises: its status shows the
    outcome anyway, and a watch of it ends (the state machine found it once showing pending)."""
    backend = MemoryBackend(Shape.KUBEFLOW, auto_run=True)
    cluster = compose(backend)
    restart = Rule(on=(CauseKind.NON_ZERO_EXIT, CauseKind.OUT_OF_MEMORY), action=Action.RESTART, budget=1)
    spec = JobSpec(name="native", command=("train",), recovery=RecoveryPolicy(rules=(restart,)))
    await cluster.operator.submit(spec, ADA, supervised=False)
    (view,) = await backend.list("native")
    backend.env.exit(view.id, 1)  # restarted in place
    backend.env.complete(view.id)
    async with asyncio.timeout(10):
        seen = [st async for st in cluster.observer.watch("native", poll_interval=0.01)]
    assert (seen[-1].state, seen[-1].settled) == (State.SUCCEEDED, False)
    record, _ = await cluster.store.get("native")
    assert record.submissions[0].restarts == 0  # nothing was recorded: status alone shows it


async def test_an_unsupervised_job_without_rules_is_launched_by_submit() -> None:
    backend = MemoryBackend(Shape.KUBEFLOW)
    cluster = compose(backend)
    await cluster.operator.submit(JobSpec(name="plain", command=("train",)), ADA)
    (view,) = await backend.list("plain")
    assert view.phase is Phase.QUEUED
    assert (await cluster.observer.get("plain")).state is State.PENDING


async def test_open_finds_the_memory_adapter_by_entry_point() -> None:
    cluster = await dispatch.open("memory", {"shape": "kubeflow", "auto_run": True})
    assert isinstance(cluster.backend, MemoryBackend)
    assert cluster.backend.shape is Shape.KUBEFLOW
    assert cluster.backend.auto_run
    assert cluster.backend.name == "memory-kubeflow"
    assert isinstance(cluster.store, MemoryStore)
    plan = await cluster.operator.submit(seed_spec(), ADA, supervised=True)
    decision = await cluster.supervisor().drive(plan.job)
    assert decision.state is State.RUNNING
    await cluster.aclose()


async def test_open_uses_the_store_it_is_given() -> None:
    store = MemoryStore()
    cluster = await dispatch.open("memory", store=store)
    assert cluster.store is store
    assert isinstance(cluster.backend, MemoryBackend)
    assert (cluster.backend.shape, cluster.backend.auto_run) == (Shape.SLURM, False)


async def test_open_refuses_an_unknown_adapter() -> None:
    with pytest.raises(AdapterNotFound) as caught:
        await dispatch.open("pbs")
    assert caught.value.name == "pbs"
    assert "'pbs'" in str(caught.value)
    assert "memory" in str(caught.value)
    assert isinstance(caught.value, LookupError)


async def test_open_refuses_bad_memory_config() -> None:
    with pytest.raises(ValueError, match="unknown config key"):
        await dispatch.open("memory", {"shape": "slurm", "nodes": 3})
    with pytest.raises(ValueError, match="shape must be one of"):
        await dispatch.open("memory", {"shape": "pbs"})


def test_the_protocols_are_satisfied_by_the_memory_implementations() -> None:
    assert isinstance(MemoryBackend(), dispatch.Backend)
    assert isinstance(MemoryStore(), dispatch.RecordStore)


def test_py_typed_ships() -> None:
    assert files("dispatch").joinpath("py.typed").is_file()
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "py.typed" in config["tool"]["setuptools"]["package-data"]["dispatch"]

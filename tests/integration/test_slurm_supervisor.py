"""The supervisor over the Slurm bridge on the real Slurm: the seed scenario and a crash mid-protocol."""

from __future__ import annotations

import asyncio
import time

import pytest

from dispatch import SlurmOptions
from dispatch._backends.slurm._adapter import open_adapter
from dispatch._cluster import compose
from dispatch._decide import Create, Done, Wait
from dispatch._memstore import MemoryStore
from dispatch._model import (
    Action,
    CauseKind,
    JobSpec,
    Phase,
    RecoveryPolicy,
    Rule,
    State,
)
from dispatch._supervisor import Supervisor
from tests.support.builders import ALICE
from tests.support.slurmlab import SlurmLab

pytestmark = [pytest.mark.integration, pytest.mark.slurm]


async def test_seed_scenario_preemption_then_resubmission(slurm: SlurmLab) -> None:
    # The default poll interval (2 s): the time from preemption to authorization is the figure.
    backend = open_adapter(slurm.backend_config())
    cluster = compose(backend)
    spec = JobSpec(
        name="seed",
        command=("bash", "-c", "sleep 6"),
        recovery=RecoveryPolicy(rules=(Rule(on=(CauseKind.PREEMPTED,), action=Action.RESUBMIT, budget=2),)),
        slurm=SlurmOptions(partition="lowcxl", cpus_per_task=2),
    )
    try:
        plan = await cluster.operator.submit(spec, ALICE, supervised=True)
        assert plan.rules[0].enforcer.value == "supervisor"
        run = asyncio.create_task(cluster.supervisor().run("seed"))
        deadline = time.monotonic() + 60
        while not any(v.phase is Phase.RUNNING for v in await backend.list("seed")):
            assert time.monotonic() < deadline, "submission 1 never ran"
            assert not run.done()
            await asyncio.sleep(0.2)
        preempted_at = time.time()
        slurm.submit_blocker("high", seconds=3)  # preempts submission 1 (PreemptMode=CANCEL)
        record = await asyncio.wait_for(run, 120)
    finally:
        await cluster.aclose()

    history = [(t.from_, t.to, t.submission) for t in record.history]
    assert history == [(State.PENDING, State.RECOVERING, 2), (State.RECOVERING, State.SUCCEEDED, 2)]
    assert record.history[0].cause.kind is CauseKind.PREEMPTED
    assert record.state is State.SUCCEEDED
    assert record.settled
    assert record.plan.rules[0].firings == 1
    assert [s.cause.kind if s.cause else None for s in record.submissions] == [
        CauseKind.PREEMPTED,
        CauseKind.NONE,
    ]
    ids = [s.canonical for s in record.submissions]
    assert len(set(ids)) == 2
    for object_id in ids:
        assert slurm.job_state(str(object_id)).get("JobState") in ("PREEMPTED", "COMPLETED", None)
    latency = record.history[0].time.timestamp() - preempted_at
    print(f"\npreemption -> submission 2 authorized: {latency:.2f} s (poll interval 2 s)")
    assert latency < 10


async def test_crash_between_submit_and_record_settles_with_one_run(slurm: SlurmLab) -> None:
    store = MemoryStore()
    first = open_adapter(slurm.backend_config(poll_interval=0.25))
    spec = JobSpec(name="crashy", command=("bash", "-c", "sleep 1"))
    cluster = compose(first, store=store)
    await cluster.operator.submit(spec, ALICE, supervised=True)
    sup = Supervisor(first, store)
    # Step until the object of submission 1 is created, then 'crash' before recording it.
    for _ in range(10):
        decision = await sup.step("crashy")
        if isinstance(decision.step, Create):
            break
    else:
        pytest.fail("never reached Create")
    # The crashed supervisor's create was retried (the first answer was lost): a second held object.
    record, _ = await store.get("crashy")
    await first.create("crashy", 1, spec, record.plan)
    await first.aclose()

    second = open_adapter(slurm.backend_config(poll_interval=0.25))
    try:
        views = await second.list("crashy")
        assert [v.phase for v in views] == [Phase.HELD, Phase.HELD]
        record = await asyncio.wait_for(Supervisor(second, store).run("crashy"), 90)
        final = {v.id: v for v in await second.list("crashy")}
    finally:
        await second.aclose()
    assert record.state is State.SUCCEEDED
    assert record.settled
    assert len(record.submissions) == 1
    canonical = record.submissions[0].canonical
    orphans = [i for i in final if i != canonical]
    assert len(orphans) == 1
    assert final[orphans[0]].cancelled
    info = slurm.job_state(orphans[0])
    if info:  # Slurm may already have forgotten it (MinJobAge)
        assert info["JobState"] == "CANCELLED"
        assert info.get("RunTime") == "00:00:00"  # the held orphan never ran
    assert not isinstance(decision.step, Wait | Done)


@pytest.mark.timeout(240)
async def test_a_time_limit_is_hit_and_recovered(slurm: SlurmLab) -> None:
    """Slurm's own time limit (one minute, ``TIMEOUT``) ends submission 1; the rule on
    ``time-limit`` resubmits, and submission 2 (which reads its number) succeeds."""
    backend = open_adapter(slurm.backend_config(poll_interval=0.5))
    cluster = compose(backend)
    script = '[ "$DISPATCH_SUBMISSION" = 2 ] && exit 0; sleep 600'
    spec = JobSpec(
        name="limited",
        command=("bash", "-c", script),
        time_limit_seconds=60,
        recovery=RecoveryPolicy(rules=(Rule(on=(CauseKind.TIME_LIMIT,), budget=1),)),
    )
    try:
        plan = await cluster.operator.submit(spec, ALICE, supervised=True)
        assert plan.time_limit is not None
        assert plan.time_limit.enforcer.value == "scheduler"
        record = await asyncio.wait_for(cluster.supervisor().run("limited"), 220)
    finally:
        await cluster.aclose()
    assert [(t.from_, t.to, t.submission, t.cause.kind) for t in record.history] == [
        (State.PENDING, State.RECOVERING, 2, CauseKind.TIME_LIMIT),
        (State.RECOVERING, State.SUCCEEDED, 2, CauseKind.NONE),
    ]


async def test_the_deadline_ends_the_job(slurm: SlurmLab) -> None:
    """The supervisor's deadline: the running job is cancelled (scancel: SIGTERM, then KillWait),
    the job fails with ``deadline-exceeded`` and nothing is resubmitted."""
    backend = open_adapter(slurm.backend_config(poll_interval=0.25))
    cluster = compose(backend)
    spec = JobSpec(
        name="late",
        command=("bash", "-c", "sleep 600"),
        deadline_seconds=5,
        recovery=RecoveryPolicy(rules=(Rule(on=(CauseKind.UNKNOWN, CauseKind.PREEMPTED), budget=3),)),
    )
    try:
        await cluster.operator.submit(spec, ALICE, supervised=True)
        record = await asyncio.wait_for(cluster.supervisor().run("late"), 120)
    finally:
        await cluster.aclose()
    assert [(t.from_, t.to, t.submission, t.cause.kind) for t in record.history] == [
        (State.PENDING, State.FAILED, 1, CauseKind.DEADLINE_EXCEEDED),
    ]
    (only,) = record.submissions
    assert only.stop is not None
    assert record.cause.stop is not None
    assert slurm.job_state(str(only.canonical)).get("JobState") in ("CANCELLED", None)

"""Suspend, resume and retry by a person through the library (``Operator``) on the real Slurm: the
suspend cancels the running Slurm job, the resume and the retry each submit a new one, and the
history names each person. Submission 2 fails by itself (it reads its number from
``DISPATCH_SUBMISSION``), which no rule covers; the retry's submission 3 succeeds."""

from __future__ import annotations

import asyncio
import time

import pytest

from dispatch import Actor, ActorKind, JobSpec, Phase, RecoveryPolicy, SlurmOptions, State
from dispatch._backends.slurm._adapter import open_adapter
from dispatch._cluster import compose
from dispatch._protocols import Backend
from tests.support.builders import ALICE
from tests.support.slurmlab import SlurmLab

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

BOB = Actor(kind=ActorKind.HUMAN, id="bob")
CAROL = Actor(kind=ActorKind.HUMAN, id="carol")
DAN = Actor(kind=ActorKind.HUMAN, id="dan")
SCRIPT = 'case "$DISPATCH_SUBMISSION" in 1) sleep 600 ;; 2) exit 3 ;; *) exit 0 ;; esac'


async def running(backend: Backend, job: str, submission: int) -> str:
    deadline = time.monotonic() + 90
    while True:
        for view in await backend.list(job):
            if view.submission == submission and view.phase is Phase.RUNNING:
                return view.id
        assert time.monotonic() < deadline, f"submission {submission} never ran"
        await asyncio.sleep(0.2)


async def test_suspend_resume_and_retry_on_slurm(slurm: SlurmLab) -> None:
    backend = open_adapter(slurm.backend_config(poll_interval=0.25))
    cluster = compose(backend)
    spec = JobSpec(
        name="byhand",
        command=("bash", "-c", SCRIPT),
        recovery=RecoveryPolicy(),
        slurm=SlurmOptions(partition="low", cpus_per_task=2),
    )
    try:
        await cluster.operator.submit(spec, ALICE, supervised=True)
        supervisor = cluster.supervisor(poll_interval=0.25)
        run = asyncio.create_task(supervisor.run("byhand"))
        first = await running(backend, "byhand", 1)

        assert await cluster.operator.suspend("byhand", BOB)
        deadline = time.monotonic() + 60
        while (await cluster.store.get("byhand")).record.state is not State.SUSPENDED or any(
            v.phase is not Phase.ENDED for v in await backend.list("byhand")
        ):
            assert time.monotonic() < deadline, "the suspend never stopped submission 1"
            await asyncio.sleep(0.2)
        assert slurm.job_state(first).get("JobState") in ("CANCELLED", None)
        assert not run.done()  # a suspended job is not settled: its supervisor waits

        assert await cluster.operator.resume("byhand", CAROL)
        failed = await asyncio.wait_for(run, 120)  # submission 2 exits 3: failed, settled
        assert failed.state is State.FAILED
        assert failed.cause.exit_code == 3

        assert await cluster.operator.retry("byhand", DAN)
        done = await asyncio.wait_for(cluster.supervisor(poll_interval=0.25).run("byhand"), 120)
    finally:
        await cluster.aclose()

    assert [(t.from_, t.to, t.submission, t.actor) for t in done.history] == [
        (State.PENDING, State.SUSPENDED, 1, BOB),
        (State.SUSPENDED, State.PENDING, 2, CAROL),
        (State.PENDING, State.FAILED, 2, done.history[2].actor),
        (State.FAILED, State.PENDING, 3, DAN),
        (State.PENDING, State.SUCCEEDED, 3, done.history[4].actor),
    ]
    assert done.history[2].actor.kind is ActorKind.SUPERVISOR
    assert [s.authorized_by for s in done.submissions[1:]] == [CAROL, DAN]
    assert len({s.canonical for s in done.submissions}) == 3
    assert done.settled

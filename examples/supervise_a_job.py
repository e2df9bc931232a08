"""The tutorial: submit a job, supervise it, preempt it, watch dispatch recover it.

Runs in-process against the memory backend shaped like Slurm, with the in-memory record store.
``python examples/supervise_a_job.py --no-supervisor`` shows the refusal when no supervisor will run.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable

import dispatch


async def wait_for(
    observer: dispatch.Observer, job: str, ok: Callable[[dispatch.Status], bool]
) -> dispatch.Status:
    """Poll until the job's status satisfies ``ok``; a host would follow ``observer.watch`` instead."""
    async with asyncio.timeout(10):
        while True:
            status = await observer.get(job)
            if ok(status):
                return status
            await asyncio.sleep(0.005)


async def main(supervised: bool = True) -> None:
    backend = dispatch.MemoryBackend(dispatch.Shape.SLURM, auto_run=True)
    store = dispatch.MemoryStore()
    cluster = dispatch.compose(backend, store=store)

    spec = dispatch.JobSpec(
        name="finetune",
        command=("torchrun", "train.py"),
        nodes=2,
        recovery=dispatch.RecoveryPolicy(
            rules=(
                dispatch.Rule(on=(dispatch.CauseKind.PREEMPTED,), action=dispatch.Action.RESUBMIT, budget=2),
            )
        ),
    )
    me = dispatch.Actor(kind=dispatch.ActorKind.HUMAN, id="ada")

    try:
        plan = await cluster.operator.submit(spec, me, supervised=supervised)
    except dispatch.PlanError as error:
        print("refused:", error)
        return

    print("rule 0 is enforced by the", plan.rules[0].enforcer)
    print("uncovered:", "[" + " ".join(plan.uncovered) + "]")

    supervisor = dispatch.Supervisor(backend, store)
    done = asyncio.create_task(supervisor.run(plan.job))

    observer = cluster.observer
    status = await wait_for(observer, plan.job, lambda s: s.state is dispatch.State.RUNNING)
    first = status.submissions[0]
    print(status.state, "as submission", first.n)

    assert first.canonical is not None
    backend.env.preempt(first.canonical)

    status = await wait_for(
        observer, plan.job, lambda s: s.state is dispatch.State.RUNNING and len(s.submissions) == 2
    )
    second = status.submissions[1]
    print(status.state, "as submission", second.n, "after", status.plan.rules[0].firings, "firing of rule 0")

    assert second.canonical is not None
    backend.env.complete(second.canonical)
    await done

    status = await observer.get(plan.job)
    print(status.state, "with cause", status.cause.kind)
    for t in status.history:
        print(f"  {t.from_} -> {t.to} (submission {t.submission})")


if __name__ == "__main__":
    asyncio.run(main(supervised="--no-supervisor" not in sys.argv[1:]))

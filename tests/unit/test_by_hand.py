"""A person's retry, suspend and resume through the library (``Operator``) on the memory backend:
each is recorded with the person as actor, a retry reopens only a failed job once it has settled
(never two submissions at once), a suspend stops the running submission and a resume authorizes
the next one without spending any rule's budget."""

from __future__ import annotations

import pytest

from dispatch import (
    Actor,
    ActorKind,
    Backoff,
    CauseKind,
    InvalidTransition,
    JobSpec,
    MemoryBackend,
    ObjectView,
    Phase,
    Record,
    RecoveryPolicy,
    Rule,
    Shape,
    State,
    compose,
)
from dispatch._cluster import Cluster
from dispatch._decide import RecordSuspend, Resume, decide

ADA = Actor(kind=ActorKind.HUMAN, id="ada")
BOB = Actor(kind=ActorKind.HUMAN, id="bob")
PREEMPT_ONCE = Rule(on=(CauseKind.PREEMPTED,), budget=1)


async def started(*rules: Rule) -> tuple[Cluster, MemoryBackend]:
    backend = MemoryBackend(Shape.SLURM, auto_run=True)
    cluster = compose(backend)
    spec = JobSpec(name="j", command=("train",), recovery=RecoveryPolicy(rules=rules))
    await cluster.operator.submit(spec, ADA, supervised=True)
    await cluster.supervisor().drive("j")
    return cluster, backend


async def running(backend: MemoryBackend) -> ObjectView:
    (view,) = [o for o in await backend.list("j") if o.phase is Phase.RUNNING]
    return view


async def record(cluster: Cluster) -> Record:
    return (await cluster.store.get("j")).record


def moves(r: Record) -> list[tuple[str, str, int | None, str]]:
    return [(t.from_.value, t.to.value, t.submission, t.actor.id) for t in r.history]


# ---- retry ------------------------------------------------------------------------------------------


async def test_a_retry_reopens_a_failed_job_with_a_new_submission() -> None:
    cluster, backend = await started(PREEMPT_ONCE)
    backend.env.preempt((await running(backend)).id)
    await cluster.supervisor().drive("j")
    backend.env.preempt((await running(backend)).id)
    failed = await cluster.supervisor().run("j")
    assert failed.state is State.FAILED
    assert failed.settled

    assert await cluster.operator.retry("j", BOB)
    assert (await cluster.observer.get("j")).state is State.PENDING  # the reopen is due
    await cluster.supervisor().drive("j")
    after = await record(cluster)
    assert moves(after)[-1] == ("failed", "pending", 3, "bob")
    assert after.submissions[-1].authorized_by == BOB
    assert after.submissions[-1].rule is None
    assert not after.settled
    assert after.retries == 1
    assert after.plan.rules[0].firings == 1  # the retry spends no budget
    # The rule's budget is spent: the next preemption fails the job again.
    backend.env.preempt((await running(backend)).id)
    assert (await cluster.supervisor().run("j")).state is State.FAILED


async def test_a_fresh_budget_lets_the_rule_fire_again() -> None:
    cluster, backend = await started(PREEMPT_ONCE)
    for _ in range(2):
        backend.env.preempt((await running(backend)).id)
        await cluster.supervisor().drive("j")
    assert (await cluster.supervisor().run("j")).state is State.FAILED

    assert await cluster.operator.retry("j", BOB, fresh_budget=0)
    await cluster.supervisor().drive("j")
    backend.env.preempt((await running(backend)).id)
    await cluster.supervisor().drive("j")
    r = await record(cluster)
    assert r.state is State.RECOVERING  # the renewed rule fired on submission 3's preemption
    assert r.plan.rules[0].firings == 2
    assert r.plan.rules[0].renewed == 1
    assert r.plan.rules[0].left == 0
    assert [t.to.value for t in r.history] == ["recovering", "failed", "pending", "recovering"]


async def test_only_a_failed_job_is_retried() -> None:
    cluster, backend = await started()
    with pytest.raises(InvalidTransition, match="only a failed job"):
        await cluster.operator.retry("j", BOB)  # running
    backend.env.complete((await running(backend)).id)
    assert (await cluster.supervisor().run("j")).state is State.SUCCEEDED
    with pytest.raises(InvalidTransition, match="succeeded: only a failed job"):
        await cluster.operator.retry("j", BOB)


async def test_a_cancelled_job_is_not_retried() -> None:
    cluster, _ = await started()
    await cluster.operator.cancel("j", ADA)
    assert (await cluster.supervisor().run("j")).state is State.CANCELLED
    with pytest.raises(InvalidTransition, match="cancelled"):
        await cluster.operator.retry("j", BOB)


async def test_a_retry_names_a_rule_the_job_has() -> None:
    cluster, backend = await started()
    backend.env.preempt((await running(backend)).id)
    await cluster.supervisor().run("j")
    with pytest.raises(InvalidTransition, match="no rule 3"):
        await cluster.operator.retry("j", BOB, fresh_budget=3)


async def test_a_retry_waits_until_the_failed_job_has_settled() -> None:
    """Never two submissions at once: the failed submission's object still runs its processes."""
    cluster, backend = await started()
    backend.env.preempt((await running(backend)).id)
    await cluster.supervisor().step("j")  # failed, not settled
    r = await record(cluster)
    assert r.state is State.FAILED
    assert not r.settled
    assert await cluster.operator.retry("j", BOB)
    assert not await cluster.operator.retry("j", BOB)  # asked already, not yet taken
    r = await record(cluster)
    assert not isinstance(decide(r, await backend.list("j")).step, Resume)
    await cluster.supervisor().drive("j")
    assert moves(await record(cluster))[-1] == ("failed", "pending", 2, "bob")


# ---- suspend and resume -----------------------------------------------------------------------------


async def test_suspend_stops_the_running_submission_and_resume_starts_the_next() -> None:
    cluster, backend = await started(PREEMPT_ONCE)
    first = await running(backend)
    assert await cluster.operator.suspend("j", BOB)
    assert not await cluster.operator.suspend("j", BOB)  # already asked
    step = decide(await record(cluster), await backend.list("j")).step
    assert step == RecordSuspend(BOB)
    await cluster.supervisor().drive("j")
    r = await record(cluster)
    assert r.state is State.SUSPENDED
    assert moves(r) == [("pending", "suspended", 1, "bob")]
    assert all(o.phase is Phase.ENDED for o in await backend.list("j"))
    assert first.id in {o.id for o in await backend.list("j") if o.cancelled}
    assert (await cluster.observer.get("j")).state is State.SUSPENDED

    assert await cluster.operator.resume("j", ADA)
    await cluster.supervisor().drive("j")
    r = await record(cluster)
    assert moves(r) == [("pending", "suspended", 1, "bob"), ("suspended", "pending", 2, "ada")]
    assert r.submissions[-1].authorized_by == ADA
    assert r.plan.rules[0].firings == 0  # a resume spends no budget
    assert (await running(backend)).submission == 2
    assert not await cluster.operator.resume("j", ADA)  # nothing suspended


async def test_a_suspend_during_a_backoff_takes_the_place_of_the_firing() -> None:
    cluster, backend = await started(
        Rule(on=(CauseKind.PREEMPTED,), budget=1, backoff=Backoff(base_seconds=600))
    )
    backend.env.preempt((await running(backend)).id)
    await cluster.supervisor().drive("j")  # the end is recorded, the backoff runs
    await cluster.operator.suspend("j", BOB)
    await cluster.operator.resume("j", BOB)  # before the supervisor saw it: nothing happens
    await cluster.supervisor().drive("j")
    assert (await record(cluster)).history == ()
    await cluster.operator.suspend("j", BOB)
    await cluster.supervisor().drive("j")
    await cluster.operator.resume("j", ADA)
    await cluster.supervisor().drive("j")
    r = await record(cluster)
    assert moves(r) == [("pending", "suspended", 1, "bob"), ("suspended", "pending", 2, "ada")]
    assert r.plan.rules[0].firings == 0
    assert r.submissions[0].cause is not None
    assert r.submissions[0].cause.kind is CauseKind.PREEMPTED  # how it really ended is kept


async def test_a_suspended_job_can_be_cancelled() -> None:
    cluster, _ = await started()
    await cluster.operator.suspend("j", BOB)
    await cluster.supervisor().drive("j")
    await cluster.operator.cancel("j", ADA)
    r = await cluster.supervisor().run("j")
    assert moves(r)[-1] == ("suspended", "cancelled", 1, "ada")


async def test_a_job_with_an_outcome_is_not_suspended() -> None:
    cluster, backend = await started()
    backend.env.complete((await running(backend)).id)
    await cluster.supervisor().run("j")
    with pytest.raises(InvalidTransition, match="succeeded"):
        await cluster.operator.suspend("j", BOB)


async def test_a_submission_that_ended_by_itself_is_left_to_the_rules() -> None:
    """A suspend that comes as the canonical succeeds does not hide the success."""
    cluster, backend = await started()
    backend.env.complete((await running(backend)).id)
    await cluster.operator.suspend("j", BOB)
    assert (await cluster.supervisor().run("j")).state is State.SUCCEEDED

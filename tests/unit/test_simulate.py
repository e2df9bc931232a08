"""The plan's "what if": :func:`dispatch.simulate` walks the rules over a sequence of causes with the
core's own decision, and agrees with a real supervisor on the memory backend run over the same
causes (history, firings, outcome); ``kubectl dispatch plan FILE --simulate`` prints it."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatch import (
    Backoff,
    Cause,
    CauseKind,
    ExitCodes,
    JobSpec,
    MemoryBackend,
    MemoryStore,
    Phase,
    Record,
    RecoveryPolicy,
    Rule,
    Shape,
    State,
    Supervisor,
    Wait,
    compose,
    make_plan,
    simulate,
)
from dispatch._backends.memory._adapter import Env
from dispatch._cli.main import main
from dispatch._simulate import parse_cause
from tests.support import builders
from tests.support.records import ADA, T0

RULES = (
    Rule(on=(CauseKind.PREEMPTED, CauseKind.NODE_LOST), budget=2, backoff=Backoff(base_seconds=30)),
    Rule(on=(CauseKind.OUT_OF_MEMORY,), budget=1),
    Rule(on=(CauseKind.NON_ZERO_EXIT,), budget=1, exit_codes=ExitCodes(operator="In", values=(3,))),
)
SPEC = JobSpec(name="train", command=("train",), recovery=RecoveryPolicy(rules=RULES))


def test_the_rules_walked_over_causes() -> None:
    backend = MemoryBackend(Shape.SLURM)
    plan = make_plan("train", SPEC, backend.capabilities, supervised=True)
    sim = simulate(SPEC, plan, ["preempted", "preempted", "out-of-memory"])
    rows = [
        (e.submission, e.cause.kind, e.rule, e.backoff_seconds, e.next_submission, e.state) for e in sim.ends
    ]
    assert rows == [
        (1, CauseKind.PREEMPTED, 0, 30.0, 2, State.RECOVERING),
        (2, CauseKind.PREEMPTED, 0, 60.0, 3, State.RECOVERING),
        (3, CauseKind.OUT_OF_MEMORY, 1, 0.0, 4, State.RECOVERING),
        (4, CauseKind.NONE, None, 0.0, None, State.SUCCEEDED),
    ]
    assert [e.budget_left for e in sim.ends[:3]] == [1, 0, 0]
    assert sim.state is State.SUCCEEDED
    assert sim.unused == ()
    assert sim.record.plan.rules[0].firings == 2
    assert sim.record.settled


def test_a_spent_budget_ends_the_job_and_the_rest_is_never_met() -> None:
    plan = make_plan("train", SPEC, MemoryBackend().capabilities, supervised=True)
    sim = simulate(SPEC, plan, ["node-lost", "preempted", "preempted", "out-of-memory"])
    assert sim.state is State.FAILED
    assert sim.cause.kind is CauseKind.PREEMPTED
    assert [e.state for e in sim.ends] == [State.RECOVERING, State.RECOVERING, State.FAILED]
    assert [c.kind for c in sim.unused] == [CauseKind.OUT_OF_MEMORY]


def test_exit_codes_pick_the_rule() -> None:
    plan = make_plan("train", SPEC, MemoryBackend().capabilities, supervised=True)
    assert simulate(SPEC, plan, ["non-zero-exit:3"]).state is State.SUCCEEDED
    other = simulate(SPEC, plan, ["non-zero-exit:4"])
    assert other.state is State.FAILED
    assert other.cause.exit_code == 4


def test_a_scheduler_rule_restarts_in_place() -> None:
    spec = JobSpec(
        name="train",
        command=("train",),
        recovery=RecoveryPolicy(
            rules=(Rule(on=(CauseKind.NON_ZERO_EXIT, CauseKind.OUT_OF_MEMORY), action="restart", budget=1),)
        ),
    )
    backend = MemoryBackend(Shape.KUBEFLOW)
    plan = make_plan("train", spec, backend.capabilities, supervised=True)
    sim = simulate(spec, plan, ["out-of-memory", "out-of-memory"])
    assert [(e.submission, e.in_place, e.state) for e in sim.ends] == [
        (1, True, State.RECOVERING),
        (1, False, State.FAILED),
    ]
    assert sim.record.plan.rules[0].firings == 1


def test_a_word_that_is_no_cause_is_refused() -> None:
    with pytest.raises(ValueError, match="'bogus' is not a cause"):
        parse_cause("bogus")
    with pytest.raises(ValueError, match="exit code"):
        parse_cause("non-zero-exit:x")
    assert parse_cause(" non-zero-exit:3 ").exit_code == 3


# ---- it agrees with a real supervisor ---------------------------------------------------------------

ENDS: dict[CauseKind, Callable[[Env, str], None]] = {
    CauseKind.PREEMPTED: Env.preempt,
    CauseKind.NODE_LOST: Env.lose_node,
    CauseKind.OUT_OF_MEMORY: Env.out_of_memory,
    CauseKind.TIME_LIMIT: Env.time_limit,
    CauseKind.REQUEUED: Env.requeue,
}


def end_with(env: Env, object_id: str, cause: Cause) -> None:
    if cause.kind is CauseKind.NONE:
        env.complete(object_id)
    elif cause.kind is CauseKind.NON_ZERO_EXIT:
        env.exit(object_id, cause.exit_code or 1)
    else:
        ENDS[cause.kind](env, object_id)


async def supervise(spec: JobSpec, causes: list[Cause]) -> list[tuple[object, ...]]:
    """A real supervisor on the memory backend, its clock advanced over each backoff, each running
    submission ended with the next cause: the history it records."""
    backend = MemoryBackend(Shape.SLURM, auto_run=True)
    store = MemoryStore()
    now = [T0]
    supervisor = Supervisor(backend, store, clock=lambda: now[0])
    await compose(backend, store=store).operator.submit(spec, ADA, supervised=True)
    left = list(causes)
    for _ in range(1000):
        decision = await supervisor.drive(spec.name)
        step = decision.step
        if isinstance(step, Wait) and step.until is not None:
            now[0] = max(now[0], step.until)
            continue
        running = [o for o in await backend.list(spec.name) if o.phase is Phase.RUNNING]
        if not running:
            break
        end_with(backend.env, running[0].id, left.pop(0) if left else Cause(kind=CauseKind.NONE))
    record, _ = await store.get(spec.name)
    assert record.settled
    return history(record)


def history(record: Record) -> list[tuple[object, ...]]:
    rows: list[tuple[object, ...]] = [
        (t.from_, t.to, t.submission, t.cause.kind, _code(t.cause)) for t in record.history
    ]
    rows.append(tuple(r.firings for r in record.plan.rules))
    return rows


def _code(cause: Cause) -> int | None:
    """The exit code a rule may match on (the memory backend's other causes carry their own)."""
    return cause.exit_code if cause.kind is CauseKind.NON_ZERO_EXIT else None


CAUSES = st.sampled_from(
    [
        Cause(kind=CauseKind.PREEMPTED),
        Cause(kind=CauseKind.NODE_LOST),
        Cause(kind=CauseKind.OUT_OF_MEMORY),
        Cause(kind=CauseKind.TIME_LIMIT),
        Cause(kind=CauseKind.NON_ZERO_EXIT, exit_code=3),
        Cause(kind=CauseKind.NON_ZERO_EXIT, exit_code=4),
    ]
)


@settings(max_examples=40, deadline=None)
@given(st.lists(CAUSES, max_size=6))
def test_the_simulation_is_what_a_supervisor_records(causes: list[Cause]) -> None:
    plan = make_plan(SPEC.name, SPEC, MemoryBackend(Shape.SLURM).capabilities, supervised=True)
    sim = simulate(SPEC, plan, causes, start=T0)
    assert history(sim.record) == asyncio.run(supervise(SPEC, causes))
    backoffs = [timedelta(seconds=e.backoff_seconds) for e in sim.ends if e.rule == 0]
    assert all(b >= timedelta(seconds=30) for b in backoffs)


# ---- the plugin --------------------------------------------------------------------------------------


def test_plan_simulate_prints_the_table(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(
        builders.manifest(
            "train",
            backend="slurm",
            recovery={
                "rules": [
                    {"on": ["preempted"], "action": "resubmit", "budget": 2, "backoff": {"baseSeconds": 30}},
                    {"on": ["out-of-memory"], "action": "resubmit", "budget": 1},
                ]
            },
        )
    )
    out, err = io.StringIO(), io.StringIO()
    code = main(
        ["plan", str(path), "-n", "ml", "--simulate", "preempted,preempted,out-of-memory"],
        stdout=out,
        stderr=err,
    )
    assert code == 0, err.getvalue()
    lines = out.getvalue().splitlines()
    table = lines[lines.index("") + 1 :]
    assert table[0].split() == ["SUBMISSION", "CAUSE", "RULE", "BACKOFF", "NEXT", "LEFT", "CHANGE", "STATE"]
    assert [row.split() for row in table[1:5]] == [
        ["1", "preempted", "0", "30s", "2", "1", "-", "recovering"],
        ["2", "preempted", "0", "60s", "3", "0", "-", "recovering"],
        ["3", "out-of-memory", "1", "0s", "4", "0", "-", "recovering"],
        ["4", "success", "-", "-", "-", "-", "-", "succeeded"],
    ]
    assert table[5] == "ends: succeeded in submission 4"


def test_plan_simulate_refuses_a_word_that_is_no_cause(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(builders.manifest("train", backend="slurm"))
    out, err = io.StringIO(), io.StringIO()
    assert main(["plan", str(path), "-n", "ml", "--simulate", "preempted,bogus"], stdout=out, stderr=err) == 2
    assert "--simulate: 'bogus' is not a cause" in err.getvalue()


def test_the_simulation_says_what_each_firing_changes() -> None:
    from dispatch import Change, MemoryChange, SlurmOptions

    rule = Rule(
        on=(CauseKind.OUT_OF_MEMORY,), budget=3, change=Change(memory=MemoryChange(factor=2, max="8192Mi"))
    )
    spec = JobSpec(
        name="train",
        command=("t",),
        recovery=RecoveryPolicy(rules=(rule,)),
        options={"slurm": SlurmOptions(memory_per_node_mb=2048)},
    )
    plan = make_plan("train", spec, MemoryBackend(Shape.SLURM).capabilities, supervised=True)
    sim = simulate(spec, plan, ["out-of-memory", "out-of-memory", "out-of-memory"])
    assert [e.change for e in sim.ends] == [
        "spec.slurm.memoryPerNodeMb 2048 -> 4096",
        "spec.slurm.memoryPerNodeMb 4096 -> 8192",
        "",  # at its max: the third firing changes nothing
        "",
    ]

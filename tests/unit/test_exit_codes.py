"""Rules that match exit codes: the model's refusals, the matching, the plan's uncovered codes, the
decision, and the exit code (and signal) the kit reads from recorded pods.

The recordings under tests/unit/data/ hold real failed pods (a Job's container that exited 3, one
killed for its memory with 137): replayed through the kind's backend, their cause carries the code
a rule matches on.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from dispatch import MemoryBackend, MemoryStore, Shape, Supervisor
from dispatch._backends.job import CAPABILITIES as JOB_CAPABILITIES
from dispatch._backends.job._adapter import JobBackend
from dispatch._backends.jobset._adapter import JobSetBackend
from dispatch._cli._render import describe_data, describe_text
from dispatch._cli.main import main
from dispatch._controller.events import describe
from dispatch._decide import Authorize, Done, RecordCanonical, RecordOutcome, decide, describe_step
from dispatch._dispatchjob import SpecError, job_spec
from dispatch._errors import PlanError
from dispatch._model import (
    Action,
    Cause,
    CauseKind,
    Enforcer,
    ExitCodeOperator,
    ExitCodes,
    JobSpec,
    ObjectView,
    Phase,
    RecoveryPolicy,
    Rule,
    State,
)
from dispatch._plan import make_plan
from dispatch._workload import WorkloadBackend
from dispatch._workload._evidence import termination_signal
from tests.support import builders, records
from tests.support.recorded import late_clock, load, replay, restarted, watched
from tests.support.records import new_record, started, step

DATA = Path(__file__).parent / "data"
IN, NOT_IN = ExitCodeOperator.IN, ExitCodeOperator.NOT_IN
NZE = CauseKind.NON_ZERO_EXIT


def codes(operator: ExitCodeOperator, *values: int) -> ExitCodes:
    return ExitCodes(operator=operator, values=values)


def on_exit(operator: ExitCodeOperator, *values: int, budget: int = 1) -> Rule:
    return Rule(on=(NZE,), budget=budget, exit_codes=codes(operator, *values))


def exited(code: int | None) -> Cause:
    return Cause(kind=NZE, detail=f"exited with code {code}", exit_code=code)


def spec_of(*rules: dict[str, Any]) -> JobSpec:
    body = {
        "metadata": {"name": "a"},
        "spec": {"backend": "slurm", "command": ["x"], "recovery": {"rules": rules}},
    }
    return job_spec(body)


# ------------------------------------------------------------------------------------ the model


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        (
            [{"on": ["preempted"], "budget": 1, "exitCodes": {"operator": "In", "values": [1]}}],
            "spec.recovery.rules[0].exitCodes: allowed only on a rule whose on is exactly [non-zero-exit]",
        ),
        (
            [
                {
                    "on": ["non-zero-exit", "out-of-memory"],
                    "budget": 1,
                    "exitCodes": {"operator": "In", "values": [1]},
                }
            ],
            "spec.recovery.rules[0].exitCodes: allowed only",
        ),
        (
            [{"on": ["non-zero-exit"], "budget": 1, "exitCodes": {"operator": "In", "values": [0]}}],
            "spec.recovery.rules[0].exitCodes.values[0]: Input should be greater than or equal to 1",
        ),
        (
            [{"on": ["non-zero-exit"], "budget": 1, "exitCodes": {"operator": "NotIn", "values": [256]}}],
            "spec.recovery.rules[0].exitCodes.values[0]: Input should be less than or equal to 255",
        ),
        (
            [{"on": ["non-zero-exit"], "budget": 1, "exitCodes": {"operator": "In", "values": [3, 3]}}],
            "spec.recovery.rules[0].exitCodes.values: an exit code is listed twice",
        ),
        (
            [{"on": ["non-zero-exit"], "budget": 1, "exitCodes": {"operator": "In", "values": []}}],
            "spec.recovery.rules[0].exitCodes.values: Tuple should have at least 1 item",
        ),
        (
            [{"on": ["non-zero-exit"], "budget": 1, "exitCodes": {"operator": "Is", "values": [1]}}],
            "spec.recovery.rules[0].exitCodes.operator: Input should be 'In' or 'NotIn'",
        ),
        (
            [
                {"on": ["non-zero-exit"], "budget": 1, "exitCodes": {"operator": "In", "values": [1, 2]}},
                {"on": ["non-zero-exit"], "budget": 1, "exitCodes": {"operator": "NotIn", "values": [1]}},
            ],
            "spec.recovery: rules[1].on[0]: cause 'non-zero-exit' is already covered by "
            "rules[0] (their exitCodes overlap)",
        ),
        (
            [
                {"on": ["non-zero-exit"], "budget": 1},
                {"on": ["non-zero-exit"], "budget": 1, "exitCodes": {"operator": "In", "values": [137]}},
            ],
            "rules[1].on[0]: cause 'non-zero-exit' is already covered by rules[0]",
        ),
    ],
)
def test_refusals_name_the_field(rules: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(SpecError) as refused:
        spec_of(*rules)
    assert message in str(refused.value)


def test_at_most_255_codes() -> None:
    with pytest.raises(ValidationError, match="at most 255 items"):
        codes(NOT_IN, *range(1, 256), 1)
    assert len(codes(NOT_IN, *range(1, 256)).values) == 255


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (codes(IN, 1, 2), codes(IN, 137)),
        (codes(IN, 1), codes(NOT_IN, 1)),
        (codes(NOT_IN, 1, 2, 3), codes(IN, 2, 3)),
    ],
)
def test_rules_with_disjoint_codes_may_share_non_zero_exit(first: ExitCodes, second: ExitCodes) -> None:
    policy = RecoveryPolicy(
        rules=(Rule(on=(NZE,), budget=1, exit_codes=first), Rule(on=(NZE,), budget=2, exit_codes=second))
    )
    for code in range(-2, 300):
        expected = 0 if first.matches(code) else 1 if second.matches(code) else None
        assert policy.rule_for(exited(code)) == expected


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (codes(IN, 1, 2), codes(IN, 2)),
        (codes(IN, 1), codes(NOT_IN, 2)),
        (codes(NOT_IN, 1), codes(NOT_IN, 2)),
        (codes(NOT_IN, *range(1, 256)), codes(NOT_IN, 1)),  # both take 256 and above
    ],
)
def test_rules_with_overlapping_codes_are_refused(first: ExitCodes, second: ExitCodes) -> None:
    with pytest.raises(ValidationError, match=r"rules\[1\]\.on\[0\].*rules\[0\] \(their exitCodes overlap\)"):
        RecoveryPolicy(
            rules=(Rule(on=(NZE,), budget=1, exit_codes=first), Rule(on=(NZE,), budget=1, exit_codes=second))
        )


def test_a_cause_of_another_kind_keeps_one_rule() -> None:
    with pytest.raises(ValidationError, match="already covered by rules"):
        RecoveryPolicy(
            rules=(Rule(on=(CauseKind.PREEMPTED,), budget=1), Rule(on=(CauseKind.PREEMPTED,), budget=1))
        )


@pytest.mark.parametrize(
    ("exit_codes", "code", "covered"),
    [
        (codes(IN, 137), 137, True),
        (codes(IN, 137), 3, False),
        (codes(IN, 137), None, False),
        (codes(NOT_IN, 3), 137, True),
        (codes(NOT_IN, 3), 3, False),
        (codes(NOT_IN, 3), 300, True),
        (codes(NOT_IN, 3), 0, False),
        (codes(NOT_IN, 3), None, False),
        (None, 3, True),
        (None, None, True),
    ],
)
def test_matching(exit_codes: ExitCodes | None, code: int | None, covered: bool) -> None:
    rule = Rule(on=(NZE,), budget=1, exit_codes=exit_codes)
    assert rule.covers(exited(code)) is covered
    assert not rule.covers(Cause(kind=CauseKind.OUT_OF_MEMORY, exit_code=137))


# ------------------------------------------------------------------------------------- the plan


@pytest.mark.parametrize(
    ("rules", "uncovered", "left"),
    [
        ((), True, None),
        ((Rule(on=(NZE,), budget=1),), False, None),
        ((on_exit(IN, 137),), True, codes(NOT_IN, 137)),
        ((on_exit(IN, 137), on_exit(IN, 1, 2)), True, codes(NOT_IN, 1, 2, 137)),
        ((on_exit(NOT_IN, 3, 4),), True, codes(IN, 3, 4)),
        ((on_exit(NOT_IN, 3, 4), on_exit(IN, 4)), True, codes(IN, 3)),
        ((on_exit(NOT_IN, 3), on_exit(IN, 3)), False, None),
    ],
)
def test_the_plan_lists_the_codes_no_rule_covers(
    rules: tuple[Rule, ...], uncovered: bool, left: ExitCodes | None
) -> None:
    plan = new_record(*rules).plan
    assert (NZE in plan.uncovered) is uncovered
    assert plan.uncovered_exit_codes == left
    assert [r.exit_codes for r in plan.rules] == [r.exit_codes for r in rules]


def test_a_rule_with_codes_is_never_the_schedulers() -> None:
    """The Job controller's onExitCodes sees only a code: it would restart an out-of-memory kill
    (OOMKilled, 137) or a failed start (StartError, 128) under a rule on non-zero-exit with that
    code, so no native rule takes exitCodes."""
    spec = JobSpec(name="a", command=("x",), recovery=RecoveryPolicy(rules=(on_exit(IN, 137),)))
    plan = make_plan("a", spec, JOB_CAPABILITIES, supervised=True)
    assert plan.rules[0].enforcer is Enforcer.SUPERVISOR
    restart = Rule(on=(NZE,), action=Action.RESTART, budget=1, exit_codes=codes(IN, 137))
    spec = JobSpec(name="a", command=("x",), recovery=RecoveryPolicy(rules=(restart,)))
    with pytest.raises(
        PlanError, match=r"none enforces restart on \[non-zero-exit\] exitCodes In \[137\] with"
    ):
        make_plan("a", spec, JOB_CAPABILITIES, supervised=True)
    native = Rule(on=(NZE, CauseKind.OUT_OF_MEMORY), action=Action.RESTART, budget=1)
    spec = JobSpec(name="a", command=("x",), recovery=RecoveryPolicy(rules=(native,)))
    assert make_plan("a", spec, JOB_CAPABILITIES, supervised=True).rules[0].enforcer is Enforcer.SCHEDULER


@st.composite
def exit_codes(draw: st.DrawFn) -> ExitCodes:
    values = draw(st.lists(st.integers(1, 12), min_size=1, max_size=6, unique=True))
    return ExitCodes(operator=draw(st.sampled_from(ExitCodeOperator)), values=tuple(values))


@st.composite
def exit_rules(draw: st.DrawFn) -> tuple[Rule, ...]:
    """Rules on non-zero-exit the model accepts: each drawn one is kept when it does not overlap."""
    kept: list[Rule] = []
    for _ in range(draw(st.integers(0, 4))):
        with_codes = draw(st.booleans()) or kept
        rule = Rule(
            on=(NZE,),
            budget=draw(st.integers(0, 3)),
            exit_codes=draw(exit_codes()) if with_codes else None,
        )
        try:
            RecoveryPolicy(rules=(*kept, rule))
        except ValidationError:
            continue
        kept.append(rule)
    return tuple(kept)


CODES = st.one_of(st.none(), st.integers(-2, 300))


def oracle(rules: tuple[Rule, ...], code: int) -> int | None:
    """The rule that should answer a non-zero exit with ``code`` (1..255), worked out from the
    definition of In and NotIn without the model's matching."""
    for i, rule in enumerate(rules):
        wanted = rule.exit_codes
        if wanted is None or (code in wanted.values) == (wanted.operator is IN):
            return i
    return None


@settings(max_examples=300, deadline=None)
@given(rules=exit_rules(), code=CODES)
def test_at_most_one_rule_matches_and_the_plan_says_exactly_which_codes_none_does(
    rules: tuple[Rule, ...], code: int | None
) -> None:
    matching = [i for i, r in enumerate(rules) if r.covers(exited(code))]
    assert len(matching) <= 1
    policy = RecoveryPolicy(rules=rules)
    assert policy.rule_for(exited(code)) == (matching[0] if matching else None)
    plan = new_record(*rules).plan
    if code is None or code == 0:
        return  # no code: only a rule without exitCodes covers it
    assert matching == [i for i in [oracle(rules, code)] if i is not None]
    left = plan.uncovered_exit_codes
    if NZE not in plan.uncovered:
        assert matching
    elif left is not None:
        assert left.matches(code) == (not matching)
    else:
        assert not rules
        assert not matching


@settings(max_examples=150, deadline=None)
@given(rules=exit_rules(), code=st.integers(1, 14))
def test_a_matching_rule_fires_only_within_its_budget(rules: tuple[Rule, ...], code: int) -> None:
    record = started(*rules)
    firings = 0
    for n in range(1, 10):
        decision = decide(
            record, [ObjectView(id=str(n), job="job", submission=n, phase=Phase.ENDED, cause=exited(code))]
        )
        if isinstance(decision.step, RecordOutcome):
            assert decision.step.state is State.FAILED
            assert decision.step.cause.exit_code == code
            break
        assert isinstance(decision.step, Authorize)
        assert decision.step.rule == oracle(rules, code)
        firings += 1
        record = step(record, decision.step, RecordCanonical(n + 1, str(n + 1)))
    index = oracle(rules, code)
    assert firings == (0 if index is None else rules[index].budget)


# --------------------------------------------------------------------------------- the decision


def test_code_3_fails_and_137_is_resubmitted() -> None:
    record = started(on_exit(IN, 137, budget=2))
    ended = ObjectView(id="1", job="job", submission=1, phase=Phase.ENDED, cause=exited(137))
    resubmit = decide(record, [ended])
    assert resubmit.step == Authorize(2, 0, exited(137))
    assert resubmit.state is State.RECOVERING
    assert "rule 0 fired after cause non-zero-exit exit code 137" in describe_step(resubmit.step)
    record = step(record, resubmit.step, RecordCanonical(2, "2"))
    assert record.history[-1].cause.exit_code == 137
    ended = ended.model_copy(update={"id": "2", "submission": 2, "cause": exited(3)})
    failed = decide(record, [ended])
    assert failed.step == RecordOutcome(State.FAILED, exited(3))
    assert describe_step(failed.step) == "failed with cause non-zero-exit exit code 3 (exited with code 3)"
    record = step(record, failed.step)
    assert record.history[-1].cause.exit_code == 3


# -------------------------------------------------------------------- the kit reads the code


@pytest.mark.parametrize(
    ("term", "signal"),
    [
        ({"exitCode": 137, "reason": "Error"}, None),  # a kill or an exit(137): not told apart
        ({"exitCode": 137, "reason": "OOMKilled"}, 9),
        ({"exitCode": 143, "reason": "ContainerStatusUnknown"}, 15),
        ({"exitCode": 3, "reason": "Error"}, None),
        ({"exitCode": 1, "reason": "Error", "signal": 6}, 6),
        ({"exitCode": 255, "reason": "StartError"}, None),
    ],
)
def test_a_death_by_signal_is_told_apart_from_an_exit(term: dict[str, Any], signal: int | None) -> None:
    assert termination_signal(term) == signal


RECORDED = [
    # (backend, resource, recording, exit code, signal)
    (JobBackend, "jobs", "job/exit-never", 3, None),
    (JobBackend, "jobs", "job/oom-never", 137, 9),
    (JobSetBackend, "jobsets.jobset.x-k8s.io", "jobset/exit", 1, None),
]


@pytest.mark.parametrize(("make", "resource", "name", "code", "signal"), RECORDED)
async def test_a_recorded_failed_pod_gives_its_exit_code_to_the_rules(
    observer: list[WorkloadBackend], make: Any, resource: str, name: str, code: int, signal: int | None
) -> None:
    kind, _, scenario = name.partition("/")
    data = watched(DATA / kind, scenario, resource) if kind == "jobset" else load(DATA / kind, scenario)
    view = await replay(
        make, observer, data, restarted(data, resource), resource=resource, born=late_clock(data)
    )
    assert view.cause is not None
    assert (view.cause.exit_code, view.cause.signal) == (code, signal)
    # The same end, under a rule that takes its code and under one that takes another.
    ended = view.model_copy(update={"id": "1", "job": "job", "submission": 1})
    if view.cause.kind is NZE:
        taken = decide(started(on_exit(IN, code)), [ended])
        assert isinstance(taken.step, Authorize)
        assert taken.step.cause == view.cause
    other = decide(started(on_exit(NOT_IN, code)), [ended])
    assert isinstance(other.step, RecordOutcome)
    assert other.step.cause.exit_code == code


def test_kubectl_dispatch_plan_shows_the_codes_no_rule_covers(monkeypatch: pytest.MonkeyPatch) -> None:
    rules = [{"on": ["non-zero-exit"], "budget": 2, "exitCodes": {"operator": "In", "values": [137]}}]
    text = builders.manifest(backend="slurm", command=["train"], recovery={"rules": rules})
    monkeypatch.setattr("sys.stdin", io.StringIO(text))
    out, err = io.StringIO(), io.StringIO()
    assert main(["plan", "-f", "-"], stdout=out, stderr=err) == 0
    assert out.getvalue().splitlines()[-2:] == [
        "uncovered: [preempted node-lost out-of-memory time-limit non-zero-exit launch-failed no-capacity "
        "requeued unknown]",
        "uncovered exit codes of non-zero-exit: NotIn [137]",
    ]
    monkeypatch.setattr("sys.stdin", io.StringIO(text))
    out = io.StringIO()
    assert main(["plan", "-f", "-", "-o", "json"], stdout=out, stderr=err) == 0
    assert json.loads(out.getvalue())["uncoveredExitCodes"] == {"operator": "NotIn", "values": [137]}


def test_events_name_the_code_and_the_rules_codes() -> None:
    record = started(on_exit(IN, 137, budget=2))
    resubmit = Authorize(2, 0, exited(137))
    after = step(record, resubmit)
    described = describe(resubmit, record, after)
    assert described is not None
    assert described[3] == (
        "submission 1 ended with cause non-zero-exit exit code 137: exited with code 137; rule 0 "
        "(resubmit on [non-zero-exit exitCodes In [137]]) fired, enforced by the supervisor: "
        "submission 2 authorized, budget 1 of 2 left"
    )
    record = step(after, RecordCanonical(2, "2"))
    fail = RecordOutcome(State.FAILED, exited(3))
    described = describe(fail, record, step(record, fail))
    assert described is not None
    assert described[3].endswith(
        "no rule covers non-zero-exit exit code 3 (it was listed as uncovered in the plan)"
    )


async def test_the_memory_scheduler_ends_with_a_chosen_code_and_the_supervisor_answers_by_it() -> None:
    """The memory scheduler's Env ends an object with the exit code a test gives: 137 is resubmitted
    by the rule on it, 3 fails the job naming its code; its out-of-memory kill is 137 by SIGKILL."""
    backend = MemoryBackend(Shape.SLURM, auto_run=True)
    store = MemoryStore()
    record = new_record(on_exit(IN, 137, budget=2))
    await store.create(record)
    supervisor = Supervisor(backend, store)

    async def canonical(n: int) -> str:
        while True:
            await supervisor.step("job")
            current = (await store.get("job")).record.current
            if current is not None and current.n == n and current.canonical is not None:
                views = [o for o in await backend.list("job") if o.id == current.canonical]
                if views and views[0].phase is Phase.RUNNING:
                    return current.canonical

    backend.env.exit(await canonical(1), 137)
    backend.env.exit(await canonical(2), 3)
    assert isinstance((await supervisor.drive("job")).step, Done)
    done = (await store.get("job")).record
    assert done.state is State.FAILED
    assert (done.cause.kind, done.cause.exit_code) == (NZE, 3)
    assert [s.cause.exit_code for s in done.submissions if s.cause is not None] == [137, 3]
    assert [t.cause.exit_code for t in done.history] == [137, 3]
    assert done.plan.rules[0].firings == 1

    await store.create(new_record(on_exit(IN, 137), name="oom"))
    await supervisor.drive("oom")  # created and released: running (auto_run)
    (view,) = await backend.list("oom")
    backend.env.out_of_memory(view.id)
    (view,) = await backend.list("oom")
    assert view.cause is not None
    assert (view.cause.kind, view.cause.exit_code, view.cause.signal) == (CauseKind.OUT_OF_MEMORY, 137, 9)


def test_kubectl_dispatch_describe_shows_the_codes() -> None:
    record = started(on_exit(IN, 137, budget=2))
    record = step(record, Authorize(2, 0, exited(137)), RecordCanonical(2, "2"))
    record = step(record, RecordOutcome(State.FAILED, exited(3)))
    text = describe_text(describe_data(records.dispatch_job(record)))
    assert (
        "rule 0 (supervisor): resubmit on [non-zero-exit exitCodes In [137]], budget 2, fired 1, 1 left"
    ) in text
    assert "  uncovered exit codes of non-zero-exit: NotIn [137]" in text.splitlines()
    rows = [line for line in text.splitlines() if line.startswith(("  1 ", "  2 "))]
    assert [row.split("   ")[-1].strip() for row in rows] == [
        "non-zero-exit exit code 137: exited with code 137",
        "non-zero-exit exit code 3: exited with code 3",
    ]

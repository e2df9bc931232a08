"""The plan: who enforces each rule, for every cause, action and budget, on both memory shapes."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatch import (
    Action,
    Capabilities,
    CauseKind,
    Enforcer,
    JobSpec,
    PlanError,
    RecoveryPolicy,
    Rule,
    Shape,
    make_plan,
)
from dispatch._backends.memory._adapter import CAPABILITIES
from dispatch._model import MAX_BUDGET, RULE_CAUSES

SHAPES = [Shape.SLURM, Shape.KUBEFLOW]
SLURM_REQUEUE_LIMIT = 5
"""Slurm's MaxBatchRequeue default: not a budget Slurm enforces exactly (preemption requeues skip it)."""
BUDGETS = [0, 1, 2, SLURM_REQUEUE_LIMIT, MAX_BUDGET]
SLURM_REQUEUE = (CauseKind.PREEMPTED, CauseKind.NODE_LOST)
"""What Slurm's own requeue covers: once a rule Slurm was given, now one it may not enforce."""
KUBEFLOW_NATIVE = (CauseKind.NON_ZERO_EXIT, CauseKind.OUT_OF_MEMORY)


def job(*rules: Rule) -> JobSpec:
    return JobSpec(name="finetune", command=("train",), recovery=RecoveryPolicy(rules=rules))


def expected_enforcer(rule: Rule, capabilities: Capabilities, supervised: bool) -> Enforcer | None:
    """The plan's law, written out independently of the code under test."""
    if any(n.enforces(rule) for n in capabilities.native):
        return Enforcer.SCHEDULER
    if rule.action is Action.RESUBMIT and supervised:
        return Enforcer.SUPERVISOR
    return None


def natively_exact(shape: Shape, rule: Rule) -> bool:
    if rule.action is not Action.RESTART:
        return False
    if shape is Shape.SLURM:
        return False  # Slurm enforces no rule exactly (docs/slurm.md)
    return frozenset(rule.on) == frozenset(KUBEFLOW_NATIVE)


CAUSE_SETS = [(c,) for c in RULE_CAUSES] + [
    SLURM_REQUEUE,
    KUBEFLOW_NATIVE,
    tuple(reversed(SLURM_REQUEUE)),
    tuple(reversed(KUBEFLOW_NATIVE)),
]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("supervised", [True, False], ids=["supervised", "unsupervised"])
@pytest.mark.parametrize("action", list(Action))
@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("on", CAUSE_SETS, ids=lambda on: "+".join(on))
def test_the_plan_of_one_rule(
    shape: Shape, supervised: bool, action: Action, budget: int, on: tuple[CauseKind, ...]
) -> None:
    rule = Rule(on=on, action=action, budget=budget)
    capabilities = CAPABILITIES[shape]
    if natively_exact(shape, rule):
        want: Enforcer | None = Enforcer.SCHEDULER
    elif action is Action.RESUBMIT and supervised:
        want = Enforcer.SUPERVISOR
    else:
        want = None
    assert want == expected_enforcer(rule, capabilities, supervised)

    if want is None:
        with pytest.raises(PlanError) as caught:
            make_plan("finetune", job(rule), capabilities, supervised=supervised)
        assert caught.value.rule == 0
        message = str(caught.value)
        assert message.startswith("rule 0 cannot be enforced: ")
        assert f"{action} on [{' '.join(on)}] with budget {budget}" in message
        if action is Action.RESUBMIT:
            assert "no supervisor will run" in message
        else:
            assert "only a scheduler can restart in place" in message
        return

    plan = make_plan("finetune", job(rule), capabilities, supervised=supervised)
    (planned,) = plan.rules
    assert planned.enforcer is want
    assert (planned.index, planned.on, planned.action, planned.budget, planned.firings) == (
        0,
        on,
        action,
        budget,
        0,
    )
    assert planned.left == budget
    assert plan.job == "finetune"
    assert plan.uncovered == tuple(c for c in RULE_CAUSES if c not in on)


def test_the_seed_plan() -> None:
    plan = make_plan(
        "finetune", job(Rule(on=(CauseKind.PREEMPTED,), budget=2)), CAPABILITIES[Shape.SLURM], supervised=True
    )
    assert plan.rules[0].enforcer is Enforcer.SUPERVISOR
    assert " ".join(plan.uncovered) == (
        "node-lost out-of-memory time-limit non-zero-exit launch-failed no-capacity requeued unknown"
    )


def test_the_seed_refusal_without_a_supervisor() -> None:
    with pytest.raises(PlanError) as caught:
        make_plan(
            "finetune",
            job(Rule(on=(CauseKind.PREEMPTED,), budget=2)),
            CAPABILITIES[Shape.SLURM],
            supervised=False,
        )
    assert caught.value.rule == 0
    assert str(caught.value) == (
        "rule 0 cannot be enforced: the scheduler does not enforce resubmit on [preempted] with budget 2 "
        "natively (it enforces nothing) and no supervisor will run"
    )


def test_slurm_enforces_no_rule_natively() -> None:
    assert CAPABILITIES[Shape.SLURM].native == ()


@pytest.mark.parametrize("budget", range(0, 11))
@pytest.mark.parametrize(
    "on",
    [SLURM_REQUEUE, (CauseKind.PREEMPTED,), (CauseKind.NODE_LOST,), (*SLURM_REQUEUE, CauseKind.TIME_LIMIT)],
    ids=lambda on: "+".join(on),
)
def test_slurm_refuses_every_restart_rule(budget: int, on: tuple[CauseKind, ...]) -> None:
    # Slurm's requeue limit does not bound preemption requeues, and its requeue flag cannot allow
    # node-failure requeues without preemption ones: no restart rule is exact, even at its limit.
    rule = Rule(on=on, action=Action.RESTART, budget=budget)
    resubmit = Rule(on=(CauseKind.UNKNOWN,), budget=1)
    with pytest.raises(PlanError) as caught:
        make_plan("finetune", job(resubmit, rule), CAPABILITIES[Shape.SLURM], supervised=True)
    assert caught.value.rule == 1
    assert str(caught.value) == (
        f"rule 1 cannot be enforced: only a scheduler can restart in place, and this one does not enforce "
        f"restart on [{' '.join(on)}] with budget {budget} (it enforces nothing)"
    )


@pytest.mark.parametrize("budget", [0, 1, SLURM_REQUEUE_LIMIT, MAX_BUDGET])
def test_slurm_rules_all_go_to_the_supervisor(budget: int) -> None:
    rules = (Rule(on=SLURM_REQUEUE, budget=budget), Rule(on=(CauseKind.TIME_LIMIT,), budget=1))
    plan = make_plan("finetune", job(*rules), CAPABILITIES[Shape.SLURM], supervised=True)
    assert [r.enforcer for r in plan.rules] == [Enforcer.SUPERVISOR, Enforcer.SUPERVISOR]
    with pytest.raises(PlanError, match=r"^rule 0 cannot be enforced: .*\(it enforces nothing\)"):
        make_plan("finetune", job(*rules), CAPABILITIES[Shape.SLURM], supervised=False)


def test_no_rules_means_everything_is_uncovered() -> None:
    plan = make_plan("finetune", job(), CAPABILITIES[Shape.KUBEFLOW], supervised=False)
    assert plan.rules == ()
    assert plan.uncovered == RULE_CAUSES
    assert CauseKind.NONE not in plan.uncovered


def test_the_error_names_the_first_rule_nobody_can_enforce() -> None:
    rules = (
        Rule(on=KUBEFLOW_NATIVE, action=Action.RESTART, budget=3),
        Rule(on=(CauseKind.PREEMPTED,), budget=1),
        Rule(on=(CauseKind.TIME_LIMIT,), action=Action.RESTART, budget=1),
    )
    with pytest.raises(PlanError) as caught:
        make_plan("finetune", job(*rules), CAPABILITIES[Shape.KUBEFLOW], supervised=True)
    assert caught.value.rule == 2
    assert "rule 2" in str(caught.value)
    with pytest.raises(PlanError) as caught:
        make_plan("finetune", job(*rules), CAPABILITIES[Shape.KUBEFLOW], supervised=False)
    assert caught.value.rule == 1


def test_a_mixed_plan() -> None:
    rules = (
        Rule(on=(CauseKind.TIME_LIMIT, CauseKind.UNKNOWN), budget=1),
        Rule(on=(CauseKind.OUT_OF_MEMORY, CauseKind.NON_ZERO_EXIT), action=Action.RESTART, budget=5),
        Rule(on=SLURM_REQUEUE, budget=2),
    )
    plan = make_plan("finetune", job(*rules), CAPABILITIES[Shape.KUBEFLOW], supervised=True)
    assert [r.enforcer for r in plan.rules] == [Enforcer.SUPERVISOR, Enforcer.SCHEDULER, Enforcer.SUPERVISOR]
    assert plan.uncovered == (
        CauseKind.LAUNCH_FAILED,
        CauseKind.NO_CAPACITY,
        CauseKind.REQUEUED,
    )


# The property: the plan's law for any policy, any capabilities (both shapes and none).


@st.composite
def policies(draw: st.DrawFn) -> tuple[Rule, ...]:
    causes = draw(st.permutations(RULE_CAUSES))
    cut = sorted(draw(st.lists(st.integers(0, len(causes)), max_size=5)))
    groups = [causes[a:b] for a, b in itertools.pairwise([0, *cut, len(causes)]) if b > a]
    keep = draw(st.lists(st.booleans(), min_size=len(groups), max_size=len(groups)))
    rules = []
    for group, kept in zip(groups, keep, strict=True):
        if not kept:
            continue
        action = draw(st.sampled_from(list(Action)))
        budget = draw(
            st.sampled_from([0, 1, 3, SLURM_REQUEUE_LIMIT, 7, MAX_BUDGET]) | st.integers(0, MAX_BUDGET)
        )
        rules.append(Rule(on=tuple(group), action=action, budget=budget))
    return tuple(rules)


CAPABILITY_SETS = [CAPABILITIES[Shape.SLURM], CAPABILITIES[Shape.KUBEFLOW], Capabilities()]


@settings(max_examples=300, deadline=None)
@given(rules=policies(), capabilities=st.sampled_from(CAPABILITY_SETS), supervised=st.booleans())
def test_the_plan_law(rules: tuple[Rule, ...], capabilities: Capabilities, supervised: bool) -> None:
    spec = job(*rules)
    wanted = [expected_enforcer(r, capabilities, supervised) for r in rules]
    if None in wanted:
        first = wanted.index(None)
        with pytest.raises(PlanError) as caught:
            make_plan(spec.name, spec, capabilities, supervised=supervised)
        assert caught.value.rule == first
        assert f"rule {first} cannot be enforced" in str(caught.value)
        assert caught.value.reason in str(caught.value)
        return
    plan = make_plan(spec.name, spec, capabilities, supervised=supervised)
    assert [r.enforcer for r in plan.rules] == wanted
    assert [r.index for r in plan.rules] == list(range(len(rules)))
    assert all(r.firings == 0 for r in plan.rules)
    for planned, rule in zip(plan.rules, rules, strict=True):
        assert (planned.on, planned.action, planned.budget) == (rule.on, rule.action, rule.budget)
        if planned.enforcer is Enforcer.SUPERVISOR:
            assert planned.action is Action.RESUBMIT
    covered = {c for r in rules for c in r.on}
    # Canonical order: the order of CauseKind's members; exactly the complement of what is covered.
    order = list(CauseKind)
    assert list(plan.uncovered) == sorted(plan.uncovered, key=order.index)
    assert set(plan.uncovered) == set(RULE_CAUSES) - covered
    assert CauseKind.NONE not in plan.uncovered

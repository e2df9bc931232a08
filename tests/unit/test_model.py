"""The model: invalid specs fail naming the field; records round-trip through camelCase JSON."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from dispatch import (
    Action,
    Actor,
    ActorKind,
    Capabilities,
    CauseKind,
    JobSpec,
    Plan,
    Record,
    RecoveryPolicy,
    Rule,
    State,
    Transition,
    make_plan,
)
from dispatch._decide import Authorize, RecordCanonical, RecordOutcome, apply
from dispatch._model import MAX_BUDGET, MAX_NAME_LENGTH, NO_CAUSE, RULE_CAUSES, Cause

ADA = Actor(kind=ActorKind.HUMAN, id="ada")
T0 = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)


def spec(**fields: Any) -> JobSpec:
    base: dict[str, Any] = {"name": "finetune", "command": ["torchrun", "train.py"], "nodes": 2}
    base.update(fields)
    return JobSpec.model_validate(base)


def locs(error: ValidationError) -> list[tuple[int | str, ...]]:
    return [tuple(e["loc"]) for e in error.errors()]


def test_a_valid_spec_parses() -> None:
    s = spec(recovery={"rules": [{"on": ["preempted"], "action": "resubmit", "budget": 2}]})
    assert s.nodes == 2
    assert s.command == ("torchrun", "train.py")
    assert s.recovery.rules[0].on == (CauseKind.PREEMPTED,)
    assert s.recovery.rules[0].action is Action.RESUBMIT


@pytest.mark.parametrize("nodes", [0, -1, -100])
def test_nodes_must_be_positive(nodes: int) -> None:
    with pytest.raises(ValidationError) as caught:
        spec(nodes=nodes)
    assert locs(caught.value) == [("nodes",)]
    assert "nodes" in str(caught.value)


def test_absurd_nodes_are_refused() -> None:
    with pytest.raises(ValidationError) as caught:
        spec(nodes=10**6)
    assert locs(caught.value) == [("nodes",)]


def test_empty_command_is_refused() -> None:
    with pytest.raises(ValidationError) as caught:
        spec(command=[])
    assert locs(caught.value) == [("command",)]
    assert "command" in str(caught.value)


def test_an_empty_command_element_is_refused() -> None:
    with pytest.raises(ValidationError) as caught:
        spec(command=["torchrun", ""])
    assert locs(caught.value) == [("command", 1)]
    assert "command.1" in str(caught.value)


@pytest.mark.parametrize("budget", [-1, -50, MAX_BUDGET + 1, 10**9])
def test_negative_and_absurd_budgets_are_refused(budget: int) -> None:
    with pytest.raises(ValidationError) as caught:
        spec(recovery={"rules": [{"on": ["preempted"], "budget": budget}]})
    assert locs(caught.value) == [("recovery", "rules", 0, "budget")]
    assert "recovery.rules.0.budget" in str(caught.value)


@pytest.mark.parametrize("budget", [0, 1, MAX_BUDGET])
def test_budgets_in_range_are_accepted(budget: int) -> None:
    assert (
        spec(recovery={"rules": [{"on": ["preempted"], "budget": budget}]}).recovery.rules[0].budget == budget
    )


def test_an_unknown_cause_name_is_refused_naming_it() -> None:
    with pytest.raises(ValidationError) as caught:
        spec(recovery={"rules": [{"on": ["preempted", "gremlins"], "budget": 1}]})
    assert ("recovery", "rules", 0, "on", 1) in locs(caught.value)
    assert "gremlins" in str(caught.value)


@pytest.mark.parametrize(
    ("rule", "field", "words"),
    [
        pytest.param({"on": ["preempted"], "action": "pray", "budget": 1}, "action", "", id="unknown-action"),
        pytest.param({"on": ["preempted", "none"], "budget": 1}, "on", "'none' means success", id="none"),
        pytest.param({"on": [], "budget": 1}, "on", "", id="covers-nothing"),
        pytest.param(
            {"on": ["preempted", "preempted"], "budget": 1}, "on", "listed twice", id="a-cause-twice"
        ),
    ],
)
def test_a_malformed_rule_is_refused_naming_its_field(rule: dict[str, Any], field: str, words: str) -> None:
    """An unknown action; none, which is not a cause a rule can cover; a rule that covers nothing;
    a cause listed twice in one rule."""
    with pytest.raises(ValidationError) as caught:
        spec(recovery={"rules": [rule]})
    assert locs(caught.value) == [("recovery", "rules", 0, field)]
    assert words in str(caught.value)


def test_a_cause_covered_by_two_rules_is_refused_naming_both_rules() -> None:
    """Decided behaviour: refused (not first-match), so which rule fires is never a question."""
    with pytest.raises(ValidationError) as caught:
        spec(
            recovery={
                "rules": [
                    {"on": ["preempted"], "budget": 1},
                    {"on": ["out-of-memory"], "budget": 1},
                    {"on": ["node-lost", "preempted"], "budget": 3},
                ]
            }
        )
    assert locs(caught.value) == [("recovery",)]
    message = str(caught.value)
    assert "rules[2].on[1]" in message
    assert "rules[0]" in message
    assert "'preempted'" in message


def test_the_rule_policy_itself_refuses_overlap() -> None:
    with pytest.raises(ValidationError, match=r"rules\[1\]\.on\[0\].*rules\[0\]"):
        RecoveryPolicy(
            rules=(
                Rule(on=(CauseKind.NODE_LOST,), budget=1),
                Rule(on=(CauseKind.NODE_LOST,), action=Action.RESTART, budget=1),
            )
        )


def test_rule_for_finds_the_one_rule() -> None:
    policy = RecoveryPolicy(
        rules=(Rule(on=(CauseKind.PREEMPTED,), budget=1), Rule(on=(CauseKind.NODE_LOST,), budget=1))
    )
    assert policy.rule_for(Cause(kind=CauseKind.PREEMPTED)) == 0
    assert policy.rule_for(Cause(kind=CauseKind.NODE_LOST)) == 1
    assert policy.rule_for(Cause(kind=CauseKind.UNKNOWN)) is None


def test_too_many_rules_are_refused() -> None:
    causes = list(RULE_CAUSES)[:9]
    rules = [{"on": [c.value], "budget": 1} for c in causes] * 2
    with pytest.raises(ValidationError) as caught:
        spec(recovery={"rules": rules})
    assert ("recovery", "rules") in locs(caught.value)


@pytest.mark.parametrize(
    "name",
    [
        "",
        "Finetune",
        "fine_tune",
        "-finetune",
        "finetune-",
        "fine tune",
        "fïnetune",
        "a" * (MAX_NAME_LENGTH + 1),
    ],
)
def test_bad_names_are_refused(name: str) -> None:
    with pytest.raises(ValidationError) as caught:
        spec(name=name)
    assert locs(caught.value) == [("name",)]


@pytest.mark.parametrize("name", ["a", "finetune", "llama-3-8b", "0x", "a" * MAX_NAME_LENGTH])
def test_good_names_are_accepted(name: str) -> None:
    assert spec(name=name).name == name


def test_unknown_fields_are_refused() -> None:
    with pytest.raises(ValidationError) as caught:
        spec(gpus=8)
    assert locs(caught.value) == [("gpus",)]


def test_models_are_frozen() -> None:
    s = spec()
    with pytest.raises(ValidationError):
        s.nodes = 3  # type: ignore[misc]


def test_running_is_never_recorded() -> None:
    s = spec()
    with pytest.raises(ValidationError) as caught:
        Record(
            job=s.name,
            spec=s,
            plan=Plan(job=s.name),
            submitted_by=ADA,
            submitted_at=T0,
            supervised=True,
            state=State.RUNNING,
        )
    assert locs(caught.value) == [("state",)]


def _a_recovered_record() -> Record:
    s = spec(recovery={"rules": [{"on": ["preempted"], "budget": 2}]})
    record = Record(
        job=s.name,
        spec=s,
        plan=make_plan(s.name, s, Capabilities(), supervised=True),
        submitted_by=ADA,
        submitted_at=T0,
        supervised=True,
    )
    sup = Actor(kind=ActorKind.SUPERVISOR, id="supervisor")
    preempted = Cause(kind=CauseKind.PREEMPTED, detail="preempted", exit_code=None)
    record = apply(record, Authorize(1), actor=sup, now=T0)
    record = apply(record, RecordCanonical(1, "1"), actor=sup, now=T0)
    record = apply(record, Authorize(2, 0, preempted), actor=sup, now=T0)
    record = apply(record, RecordCanonical(2, "2"), actor=sup, now=T0)
    done = Cause(kind=CauseKind.NONE, exit_code=0)
    return apply(record, RecordOutcome(State.SUCCEEDED, done), actor=sup, now=T0)


def test_record_json_round_trips_in_camel_case() -> None:
    record = _a_recovered_record()
    text = record.model_dump_json()
    data = json.loads(text)
    assert {"job", "spec", "plan", "submittedBy", "submittedAt", "supervised", "state", "history"} <= set(
        data
    )
    assert "submitted_by" not in data
    assert data["submissions"][0]["authorizedAt"] == "2025-01-02T03:04:05Z"
    assert data["submissions"][1]["authorizedBy"] == {"kind": "supervisor", "id": "supervisor"}
    assert data["submissions"][1]["cause"]["exitCode"] == 0
    assert [t["from"] for t in data["history"]] == ["pending", "recovering"]
    assert [t["to"] for t in data["history"]] == ["recovering", "succeeded"]
    assert all("from_" not in t for t in data["history"])
    assert data["plan"]["rules"][0]["firings"] == 1

    back = Record.model_validate_json(text)
    assert back == record
    assert back.model_dump_json() == text
    assert back.history[0].from_ is State.PENDING
    assert back.history[1].submission == 2


def test_snake_case_names_are_accepted_on_input_too() -> None:
    record = _a_recovered_record()
    data = record.model_dump(by_alias=False)
    assert Record.model_validate(data) == record


def test_a_transition_reads_from_in_json() -> None:
    t = Transition.model_validate_json(
        '{"from": "pending", "to": "recovering", "submission": 2,'
        ' "cause": {"kind": "preempted"}, "actor": {"kind": "supervisor", "id": "s"},'
        ' "time": "2025-01-02T03:04:05Z"}'
    )
    assert t.from_ is State.PENDING
    assert t.cause.kind is CauseKind.PREEMPTED
    assert json.loads(t.model_dump_json())["from"] == "pending"


def test_cause_and_actor_words_are_the_seed_words() -> None:
    assert [c.value for c in CauseKind] == [
        "preempted",
        "node-lost",
        "out-of-memory",
        "time-limit",
        "non-zero-exit",
        "launch-failed",
        "no-capacity",
        "requeued",
        "unknown",
        "deadline-exceeded",
        "none",
    ]
    assert str(ADA) == "human:ada"
    assert NO_CAUSE.kind is CauseKind.NONE

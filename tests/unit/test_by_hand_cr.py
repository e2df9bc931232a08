"""A person's suspend, resume and retry on the DispatchJob: the codec reads them from the spec with
the actor the webhook stamped, the webhook stamps who asked and refuses what the job cannot take,
the CRD lets exactly these fields change, and the plugin says a usage mistake before it asks."""

from __future__ import annotations

import copy
import io
from typing import Any

import pytest

from dispatch import Cause, CauseKind, ObjectView, Phase, Record, State
from dispatch._cli.main import main
from dispatch._constants import ANNOTATION_RETRIED_BY, ANNOTATION_SUBMITTED_BY, ANNOTATION_SUSPENDED_BY
from dispatch._controller.crd import spec_schema
from dispatch._controller.webhook import Refused, annotations_to_set, check
from dispatch._decide import (
    Authorize,
    RecordCanonical,
    RecordOutcome,
    RecordSettled,
    RecordSuspend,
    Resume,
    decide,
)
from dispatch._dispatchjob import conditions_for, job_spec, new_record, record_from
from tests.support.records import at, dispatch_job, seed_record, step

BOB = {"username": "bob"}
RUNNING = ObjectView(id="o1", job="team-a/finetune", submission=1, phase=Phase.RUNNING)
RECOVERY = {"rules": [{"on": ["preempted"], "budget": 2}]}
CAROL = {"username": "carol"}


def with_spec(body: dict[str, Any], annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    shown = copy.deepcopy(body)
    shown["spec"].update(spec)
    if annotations:
        shown["metadata"].setdefault("annotations", {}).update(annotations)
    return shown


def failed_body() -> dict[str, Any]:
    oom = Cause(kind=CauseKind.OUT_OF_MEMORY)
    record = step(
        seed_record(),
        Authorize(1),
        RecordCanonical(1, "o1"),
        RecordOutcome(State.FAILED, oom),
        RecordSettled(),
    )
    return body_of(record, 5)


def body_of(record: Record | None, version: int) -> dict[str, Any]:
    """The seed's DispatchJob holding ``record``, its rule in the spec as in the record."""
    return with_spec(at(dispatch_job(record), version), recovery=RECOVERY)


def test_the_spec_suspend_is_the_persons_latest_word() -> None:
    body = failed_body()
    running = body_of(step(seed_record(), *_first()), 3)
    asked = with_spec(running, {ANNOTATION_SUSPENDED_BY: "human:bob"}, suspend=True)
    record = record_from(asked)
    assert record.suspend is not None
    assert record.suspend.suspend
    assert str(record.suspend.actor) == "human:bob"
    assert decide(record, (RUNNING,)).step == RecordSuspend(record.suspend.actor)
    # Nothing asked: nothing read; a failed job's body without suspend has no request either.
    assert record_from(running).suspend is None
    assert record_from(body).suspend is None


def test_a_resume_is_read_once_the_record_is_suspended() -> None:
    running = body_of(step(seed_record(), *_first()), 3)
    suspended = record_from(with_spec(running, {ANNOTATION_SUSPENDED_BY: "human:bob"}, suspend=True))
    suspended = step(suspended, RecordSuspend(suspended.suspend.actor))  # type: ignore[union-attr]
    body = body_of(suspended, 4)
    resumed = record_from(with_spec(body, {ANNOTATION_SUSPENDED_BY: "human:carol"}, suspend=False))
    assert resumed.suspend is not None
    assert not resumed.suspend.suspend
    assert decide(resumed, ()).step == Resume(2, resumed.suspend.actor)
    assert [c.reason for c in conditions_for(suspended)] == ["Suspended"] * 3


def test_a_raised_retry_count_asks_for_one_retry() -> None:
    body = failed_body()
    asked = with_spec(body, {ANNOTATION_RETRIED_BY: "human:carol"}, retry={"count": 1, "freshBudget": 0})
    record = record_from(asked)
    assert record.retry_asked is not None
    assert str(record.retry_asked.actor) == "human:carol"
    step_ = decide(record, ()).step
    assert step_ == Resume(2, record.retry_asked.actor, retry=1, fresh_budget=0)
    taken = step(record, step_)
    assert taken.retries == 1
    assert taken.state is State.PENDING
    assert not taken.settled
    # The same manifest applied again asks for nothing more.
    again = record_from(with_spec(body_of(taken, 6), retry={"count": 1, "freshBudget": 0}))
    assert again.retry_asked is None


def test_a_job_created_with_a_count_starts_from_it() -> None:
    body = with_spec(body_of(None, 1), retry={"count": 3})
    record = new_record(body, job_spec(body), seed_record().plan)
    assert record.retries == 3
    assert record.retry_asked is None


# ---- the webhook ------------------------------------------------------------------------------------


def test_the_webhook_stamps_who_changed_an_ask() -> None:
    old = failed_body()
    old["metadata"]["annotations"] = {ANNOTATION_SUBMITTED_BY: "human:alice"}
    new = with_spec(old, suspend=True, retry={"count": 1})
    assert annotations_to_set(new, old, "UPDATE", BOB) == {
        ANNOTATION_SUSPENDED_BY: "human:bob",
        ANNOTATION_RETRIED_BY: "human:bob",
    }
    # An unchanged ask keeps who asked; a forged one is put back.
    later = with_spec(new, {ANNOTATION_SUSPENDED_BY: "human:bob", ANNOTATION_RETRIED_BY: "human:mallory"})
    before = with_spec(new, {ANNOTATION_SUSPENDED_BY: "human:bob", ANNOTATION_RETRIED_BY: "human:bob"})
    assert annotations_to_set(later, before, "UPDATE", CAROL) == {ANNOTATION_RETRIED_BY: "human:bob"}
    # Setting suspend back to false is a change too: the resume is carol's.
    resumed = with_spec(before, suspend=False)
    assert annotations_to_set(resumed, before, "UPDATE", CAROL) == {ANNOTATION_SUSPENDED_BY: "human:carol"}


def test_a_job_created_suspended_names_who_created_it_and_no_retry() -> None:
    body = with_spec(body_of(None, 1), suspend=True, retry={"count": 2})
    stamped = annotations_to_set(body, None, "CREATE", BOB)
    assert stamped[ANNOTATION_SUSPENDED_BY] == "human:bob"
    assert ANNOTATION_RETRIED_BY not in stamped


def test_the_webhook_allows_the_asks_and_refuses_what_the_job_cannot_take() -> None:
    failed = failed_body()
    check(with_spec(failed, suspend=True), failed, "UPDATE")
    check(with_spec(failed, retry={"count": 1, "freshBudget": 0}), failed, "UPDATE")
    running = body_of(step(seed_record(), *_first()), 3)
    cases = [
        (
            with_spec(running, retry={"count": 1}),
            running,
            "only a failed job is retried; this one is pending",
        ),
        (
            with_spec(failed, retry={"count": 1, "freshBudget": 4}),
            failed,
            "spec.retry.freshBudget: the job has no rule 4",
        ),
        (failed, with_spec(failed, retry={"count": 2}), "spec.retry.count never goes down (2 -> 0)"),
        (with_spec(failed, nodes=2, suspend=True), failed, "the spec is fixed once created"),
    ]
    for new, old, message in cases:
        with pytest.raises(Refused, match=message.replace("(", r"\(").replace(")", r"\)")):
            check(new, old, "UPDATE")


def test_the_crd_lets_the_asks_change_and_a_count_only_grow() -> None:
    schema = spec_schema()
    rules = [v["rule"] for v in schema["x-kubernetes-validations"]]
    assert not any(r.startswith(("self.suspend", "has(self.suspend)", "has(self.retry)")) for r in rules)
    assert "!has(oldSelf.retry) || (has(self.retry) && self.retry.count >= oldSelf.retry.count)" in rules
    assert schema["properties"]["suspend"]["default"] is False
    assert schema["properties"]["retry"]["required"] == ["count"]


def _first() -> tuple[Authorize, RecordCanonical]:
    return Authorize(1), RecordCanonical(1, "o1")


def test_retry_takes_a_fresh_budget_with_its_rule() -> None:
    """A usage mistake is said before any cluster is reached."""
    for args in (["--fresh-budget"], ["--rule", "0"]):
        out, err = io.StringIO(), io.StringIO()
        assert main(["retry", "train", *args], stdout=out, stderr=err) == 2
        assert "--fresh-budget and --rule N go together" in err.getvalue()

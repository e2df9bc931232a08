"""An object dispatch released and someone else suspended since is held outside dispatch, for every
kind of the kit: shown queued (never held, which decide would release again) with who holds it."""

from __future__ import annotations

from typing import Any

import pytest

from dispatch._backends.job._adapter import JOB
from dispatch._backends.jobset._adapter import JOBSET
from dispatch._backends.kubeflow._kind import PYTORCHJOB
from dispatch._backends.trainjob._adapter import TRAINJOB
from dispatch._constants import ANNOTATION_ENDED, ANNOTATION_RELEASED, LABEL_JOB, LABEL_SUBMISSION
from dispatch._decide import Release, Wait, decide
from dispatch._model import Phase
from dispatch._workload import Kind
from dispatch._workload._classify import classify
from tests.support.records import PREEMPT_TWICE, started

KINDS = [PYTORCHJOB, JOB, JOBSET, TRAINJOB]


def body(
    kind: Kind, *, released: bool, managers: list[tuple[str, str]], ended: bool = False
) -> dict[str, Any]:
    """A suspended object of ``kind`` owned by DispatchJob ns/job, submission 1; ``managers`` are the
    (time, manager) entries of managedFields that own its suspend field."""

    def owning(step: Any) -> Any:
        return {f"f:{k}": owning(v) for k, v in step.items()} if isinstance(step, dict) else {}

    annotations = {ANNOTATION_RELEASED: "2026-12-01T10:00:00+00:00"} if released else {}
    if ended:
        annotations[ANNOTATION_ENDED] = '{"kind": "preempted"}'
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Thing",
        "metadata": {
            "name": "job-1",
            "namespace": "ns",
            "resourceVersion": "7",
            "labels": {LABEL_JOB: "job", LABEL_SUBMISSION: "1"},
            "annotations": annotations,
            "ownerReferences": [{"kind": "DispatchJob", "name": "job", "uid": "u", "controller": True}],
            "managedFields": [
                {
                    "manager": who,
                    "operation": "Update",
                    "time": when,
                    "fieldsV1": owning(kind.suspend_patch(True)),
                }
                for when, who in managers
            ],
        },
        "spec": {},
    }
    for key, value in kind.suspend_patch(True).items():
        obj[key] = {**obj.get(key, {}), **value}
    assert kind.suspended(obj)
    return obj


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_suspended_after_release_is_held_outside_and_names_the_latest_holder(kind: Kind) -> None:
    managers = [("2026-12-01T10:00:00Z", "dispatch-operator"), ("2026-12-01T10:05:00Z", "kueue")]
    view = classify(kind, body(kind, released=True, managers=managers), [], now=0.0).view
    assert view.phase is Phase.QUEUED
    assert "by kueue" in view.note
    decision = decide(started(PREEMPT_TWICE), [view.model_copy(update={"id": "1"})])
    assert isinstance(decision.step, Wait)
    assert "by kueue" in decision.step.why


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_never_released_is_held_by_dispatch(kind: Kind) -> None:
    view = classify(kind, body(kind, released=False, managers=[]), [], now=0.0).view
    assert view.phase is Phase.HELD
    assert not view.note
    assert decide(started(PREEMPT_TWICE), [view.model_copy(update={"id": "1"})]).step == Release("1")


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_stopped_by_dispatch_is_ended_not_held_outside(kind: Kind) -> None:
    view = classify(kind, body(kind, released=True, managers=[], ended=True), [], now=0.0).view
    assert view.phase is Phase.ENDED
    assert not view.note

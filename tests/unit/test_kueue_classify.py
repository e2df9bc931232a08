"""Kueue's signals become causes, on recordings of the real Kueue v0.17.0
in front of the real training operator (tests/unit/data/kueue, written by hack/record.py kueue).

Each recording is replayed event by event: the PyTorchJob as the kit caches it, its pods, and its
Workload (found by the ownerReference's uid, as the shared watch indexes it), classified by the kit's
own :func:`~dispatch._workload.classify` at each step. dispatch's own annotations are the only thing
added to the recorded bodies: the LocalQueue its create writes (``dispatch.dev/queue``) and, where a
test needs a clock, the release time its release writes (the recorder wrote "1")."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dispatch._backends.kubeflow._adapter import PYTORCHJOB
from dispatch._constants import (
    ANNOTATION_QUEUE,
    ANNOTATION_RELEASED,
    KUEUE_LABEL_PRIORITY_CLASS,
    KUEUE_LABEL_QUEUE,
    LABEL_JOB,
)
from dispatch._model import CauseKind, JobSpec, Phase
from dispatch._workload import Verdict, classify
from dispatch._workload._kueue import (
    hold_for_queue,
    queue_of,
    release_patch,
    stop_patch,
    workload_view,
)

DATA = Path(__file__).parent / "data" / "kueue"
BASE = 1_000_000.0
"""The replay's clock: the recording's offsets (``at``) are added to it."""
QUEUE = "lq"
WAIT = 5
"""The recorded job's noCapacityAfterSeconds (hack/record.py kueue), as the builder annotates it."""

Body = dict[str, Any]


@dataclass(frozen=True)
class Step:
    at: float
    verdict: Verdict


def replay(name: str, *, clock_from_release: bool = False, now: float | None = None) -> Iterator[Step]:
    data = json.loads((DATA / f"{name}.json").read_text())
    job: Body | None = None
    released_at: float | None = None
    workload: Body | None = None
    pods: dict[str, Body] = {}
    for event in data["stream"]:
        obj, kind = event["object"], event["object"].get("kind")
        if kind == "PyTorchJob":
            job = json.loads(json.dumps(obj))
            job["metadata"].setdefault("annotations", {})[ANNOTATION_QUEUE] = QUEUE
            if KUEUE_LABEL_QUEUE in (job["metadata"].get("labels") or {}) and released_at is None:
                released_at = BASE + event["at"]
            if clock_from_release and released_at is not None:
                job["metadata"]["annotations"][ANNOTATION_RELEASED] = _iso(released_at)
        elif kind == "Workload" and job is not None:
            owners = obj["metadata"].get("ownerReferences") or ()
            if any(o.get("uid") == job["metadata"]["uid"] for o in owners):
                workload = None if event["type"] == "DELETED" else obj
        elif kind == "Pod" and job is not None and _labels(obj).get(LABEL_JOB) == _labels(job)[LABEL_JOB]:
            key = obj["metadata"]["name"]
            if event["type"] == "DELETED":
                pods.pop(key, None)
            else:
                pods[key] = obj
        else:
            continue
        if job is None:
            continue
        view = workload_view(workload) if workload is not None else None
        at = now if now is not None else BASE + event["at"]
        yield Step(event["at"], classify(PYTORCHJOB, job, list(pods.values()), now=at, workload=view))


def _labels(obj: Body) -> dict[str, str]:
    return dict(obj["metadata"].get("labels") or {})


def _iso(at: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(at, UTC).isoformat()


def phases(steps: Iterator[Step]) -> list[tuple[Phase, CauseKind | None]]:
    out: list[tuple[Phase, CauseKind | None]] = []
    for step in steps:
        view = step.verdict.view
        item = (view.phase, view.cause.kind if view.cause is not None else None)
        if not out or out[-1] != item:
            out.append(item)
    return out


def test_admitted_run_and_succeeded_through_kueue() -> None:
    assert phases(replay("admitted")) == [
        (Phase.HELD, None),
        (Phase.QUEUED, None),
        (Phase.RUNNING, None),
        (Phase.ENDED, CauseKind.NONE),
    ]


def test_waiting_for_quota_is_queued_with_kueues_reason_not_a_failure() -> None:
    steps = list(replay("pending-quota"))
    last = steps[-1].verdict
    assert last.view.phase is Phase.QUEUED
    assert last.stop is None
    assert last.view.waiting.startswith(
        f"waiting for Kueue admission in queue {QUEUE}: couldn't assign flavors"
    )
    assert last.view.note == ""  # queued by dispatch's own release: not held outside it (no Warning)
    assert [s.verdict.view.phase for s in steps if s.verdict.view.phase is Phase.ENDED] == []


def test_waiting_for_quota_becomes_no_capacity_after_the_jobs_own_wait_from_the_release() -> None:
    steps = list(replay("pending-quota", clock_from_release=True))
    released = steps[-1].verdict
    assert released.recheck_at is not None  # woken at the deadline: no event announces it
    deadline = released.recheck_at
    before = list(replay("pending-quota", clock_from_release=True, now=deadline - 1))[-1].verdict
    after = list(replay("pending-quota", clock_from_release=True, now=deadline))[-1].verdict
    assert before.view.phase is Phase.QUEUED
    assert after.view.phase is Phase.ENDED
    assert after.stop is not None
    assert after.view.cause is not None
    assert after.view.cause.kind is CauseKind.NO_CAPACITY
    assert f"for more than {WAIT}s" in after.view.cause.detail


@pytest.mark.parametrize(
    ("name", "how"), [("preempted", "InClusterQueue"), ("reclaimed", "InCohortReclamation")]
)
def test_a_kueue_preemption_is_preempted_and_final(name: str, how: str) -> None:
    steps = list(replay(name))
    seen = phases(iter(steps))
    assert (Phase.RUNNING, None) in seen
    first = next(i for i, s in enumerate(steps) if s.verdict.view.phase is Phase.ENDED)
    ended = steps[first].verdict
    assert ended.view.cause is not None
    assert ended.view.cause.kind is CauseKind.PREEMPTED
    assert how in ended.view.cause.detail
    assert ended.stop == ended.view.cause  # dispatch ends it, so Kueue's requeue cannot start it again
    # Requeued by Kueue, waiting for quota again, its pods gone: still the same end.
    assert {s.verdict.view.cause.kind for s in steps[first:] if s.verdict.view.cause} == {CauseKind.PREEMPTED}
    assert all(s.verdict.view.phase is Phase.ENDED for s in steps[first:])


def test_a_preemption_before_a_re_admission_is_read_from_the_eviction_counts() -> None:
    # The Workload as an operator restarted after Kueue re-admitted it would see it: Evicted gone,
    # only status.schedulingStats.evictions says so.
    data = json.loads((DATA / "preempted.json").read_text())
    evicted = next(
        e["object"]
        for e in data["stream"]
        if e["object"].get("kind") == "Workload"
        and (e["object"].get("status") or {}).get("schedulingStats")
        and e["object"]["metadata"]["name"].startswith("pytorchjob-")
    )
    readmitted = json.loads(json.dumps(evicted))
    readmitted["status"]["conditions"] = [
        c for c in readmitted["status"]["conditions"] if c["type"] in ("QuotaReserved", "Admitted")
    ]
    view = workload_view(readmitted)
    assert view is not None
    assert view.true("Evicted") is None
    job = next(e["object"] for e in reversed(data["stream"]) if e["object"].get("kind") == "PyTorchJob")
    job["metadata"]["annotations"][ANNOTATION_QUEUE] = QUEUE
    job["spec"]["runPolicy"]["suspend"] = False  # started again by Kueue
    verdict = classify(PYTORCHJOB, job, [], now=BASE, workload=view)
    assert verdict.view.phase is Phase.ENDED
    assert verdict.view.cause is not None
    assert verdict.view.cause.kind is CauseKind.PREEMPTED


def test_a_pods_ready_timeout_on_pods_that_never_start_is_launch_failed() -> None:
    steps = list(replay("pods-ready-timeout"))
    last = steps[-1].verdict
    assert last.view.phase is Phase.ENDED
    assert last.stop is not None
    assert last.view.cause is not None
    assert last.view.cause.kind is CauseKind.LAUNCH_FAILED


def test_an_administrator_deactivating_the_workload_is_an_outside_cancel() -> None:
    steps = list(replay("deactivated"))
    ended = [s.verdict for s in steps if s.verdict.view.phase is Phase.ENDED]
    assert ended, "never ended"
    assert all(v.view.cancelled and v.view.cause is not None for v in ended)
    assert {v.view.cause.kind for v in ended if v.view.cause} == {CauseKind.NONE}
    assert "deactivated in Kueue" in ended[-1].view.cause.detail  # type: ignore[union-attr]
    assert ended[-1].stop is not None  # ended for good: a reactivation must not start it again


def test_an_unqueued_object_suspended_by_someone_is_still_held_outside() -> None:
    # Behaviour 1 stays: without dispatch's queue annotation the kit's own reading applies.
    data = json.loads((DATA / "preempted.json").read_text())
    job = next(e["object"] for e in reversed(data["stream"]) if e["object"].get("kind") == "PyTorchJob")
    verdict = classify(PYTORCHJOB, job, [], now=BASE)
    assert verdict.view.phase is Phase.QUEUED
    assert "held outside dispatch" in verdict.view.note


def test_the_held_object_has_no_kueue_label_and_the_release_is_one_patch_leaving_suspend() -> None:
    spec = JobSpec(name="a", command=("x",), queue=QUEUE, workload_priority_class="high")
    body = hold_for_queue({"metadata": {"name": "a-1", "labels": {}}, "spec": {}}, spec)
    assert queue_of(body) == QUEUE
    assert not any(k.startswith("kueue.x-k8s.io/") for k in body["metadata"]["labels"])
    body["metadata"]["resourceVersion"] = "7"
    patch = release_patch(body, "2026-12-01T00:00:00+00:00")
    assert patch == {
        "metadata": {
            "resourceVersion": "7",
            "labels": {KUEUE_LABEL_QUEUE: QUEUE, KUEUE_LABEL_PRIORITY_CLASS: "high"},
            "annotations": {ANNOTATION_RELEASED: "2026-12-01T00:00:00+00:00"},
        }
    }
    assert "spec" not in patch  # suspend stays true: Kueue unsuspends it on admission
    assert stop_patch(body) == {"metadata": {"labels": {KUEUE_LABEL_QUEUE: None}}}
    unqueued = {"metadata": {"name": "b-1", "labels": {}}}
    assert release_patch(unqueued, "t") is None
    assert stop_patch(unqueued) == {}


def test_a_deactivation_stays_a_cancel_once_dispatch_has_stopped_the_object() -> None:
    # What a restarted operator reads: the stop's annotation, the Workload gone with the object.
    from dispatch._workload._fields import ended_annotation

    steps = list(replay("deactivated"))
    cause = steps[-1].verdict.stop
    assert cause is not None
    assert cause.kind is CauseKind.NONE
    data = json.loads((DATA / "deactivated.json").read_text())
    job = next(e["object"] for e in reversed(data["stream"]) if e["object"].get("kind") == "PyTorchJob")
    job["metadata"]["annotations"][ANNOTATION_QUEUE] = QUEUE
    job["metadata"]["annotations"]["dispatch.dev/ended"] = ended_annotation(cause)
    job["metadata"]["deletionTimestamp"] = "2026-12-01T15:33:00Z"
    view = classify(PYTORCHJOB, job, [], now=BASE).view
    assert view.phase is Phase.ENDED
    assert view.cancelled
    assert view.cause == cause


def test_the_watch_keeps_only_what_the_view_reads_of_each_recorded_workload() -> None:
    from dispatch._workload._kueue import project_workload

    seen = 0
    for path in sorted(DATA.glob("*.json")):
        for event in json.loads(path.read_text())["stream"]:
            body = event["object"]
            if body.get("kind") != "Workload":
                continue
            kept = project_workload(body)
            assert workload_view(kept) == workload_view(body)
            assert "podSets" not in kept.get("spec", {})
            assert "admission" not in kept.get("status", {})
            assert len(json.dumps(kept)) < len(json.dumps(body))
            seen += 1
    assert seen > 20

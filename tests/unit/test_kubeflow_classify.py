"""Classification on PyTorchJob and Pod JSON recorded from the real stack, table-style.

Each file in tests/unit/data/kubeflow/ (recorded by hack/record.py kubeflow from the lab: the real
kube-apiserver, kube-scheduler, kube-controller-manager, training operator v1.9.3 and kwok) holds the
watch events of one PyTorchJob and its pods, in arrival order, and the events Kubernetes wrote. The
adapter's own watch handlers are fed those events, and its ``list()`` must give the cause the table
says: in the recorded order, with either watch lagging the other, and in a process that starts only
after it all happened (it sees the final objects and may ask the API server, answered from the same
recording, for the pods and events).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dispatch._backends.kubeflow._adapter import PYTORCHJOB, KubeflowBackend
from dispatch._errors import TransientBackendError
from dispatch._model import CauseKind, ObjectView, Phase
from dispatch._workload import classify, parse_time, pod_evidence
from dispatch._workload._evidence import WAITING_AFTER
from tests.support import recorded
from tests.support.classified import assert_classified
from tests.support.recorded import final, late_clock, names

DATA = Path(__file__).parent / "data" / "kubeflow"
Body = dict[str, Any]

# scenario -> (phase, cause, exit code, a word of the detail, restarts)
EXPECTED: dict[str, tuple[Phase, CauseKind, int | None, str, int]] = {
    "success": (Phase.ENDED, CauseKind.NONE, None, "successfully completed", 0),
    "oom-never": (Phase.ENDED, CauseKind.OUT_OF_MEMORY, 137, "OOMKilled", 0),
    "exit-never": (Phase.ENDED, CauseKind.NON_ZERO_EXIT, 1, "exited with code 1", 0),
    "oom-onfailure": (Phase.ENDED, CauseKind.NON_ZERO_EXIT, 1, "backoff limit", 1),
    "preempt-never": (Phase.ENDED, CauseKind.PREEMPTED, None, "Preempt", 0),
    "preempt-onfailure": (Phase.ENDED, CauseKind.PREEMPTED, None, "Preempt", 0),
    "taint-never": (Phase.ENDED, CauseKind.NODE_LOST, None, "aint", 0),
    "unschedulable": (Phase.ENDED, CauseKind.NO_CAPACITY, None, "Insufficient nvidia.com/gpu", 0),
    "image-pull": (Phase.ENDED, CauseKind.LAUNCH_FAILED, None, "ErrImagePull", 0),
    "env-refused": (Phase.ENDED, CauseKind.LAUNCH_FAILED, None, "A=B", 0),
    "notready-deleted": (Phase.ENDED, CauseKind.NODE_LOST, None, "node is lost", 0),
    "node-shutdown": (Phase.ENDED, CauseKind.NODE_LOST, None, "TerminationByKubelet", 0),
    "deadline": (Phase.ENDED, CauseKind.TIME_LIMIT, None, "DeadlineExceeded", 0),
    # Watched on the lab's real node while tests/integration/test_real_node_causes.py ran.
    "real-crashloop": (Phase.ENDED, CauseKind.NONE, None, "successfully completed", 2),
}
LATE_START_ONLY = {"env-refused"}
"""Only an API read can explain these (the cache never holds the training operator's events)."""
EXIT_CODE_LOST_LATE = {"oom-onfailure"}
"""At its backoff limit the training operator deletes every pod: the exit code of the last in-place
restart was only ever on them (the PyTorchJob says "reached the specified backoff limit")."""


def recordings() -> list[str]:
    return names(DATA, EXPECTED)


def load(name: str) -> Body:
    return recorded.load(DATA, name)


async def replay(
    made: list[KubeflowBackend], data: Body, events: list[Body], *, born: float | None = None
) -> ObjectView:
    return await recorded.replay(KubeflowBackend, made, data, events, resource="pytorchjobs", born=born)


def check(name: str, view: ObjectView, *, late: bool = False) -> None:
    phase, kind, exit_code, word, restarts = EXPECTED[name]
    if late and name in EXIT_CODE_LOST_LATE:
        exit_code, restarts = None, 0
    assert_classified(view, (phase, kind, exit_code, word, restarts))


def orders(data: Body) -> dict[str, list[Body]]:
    return recorded.orders(data, "pytorchjobs")


@pytest.mark.parametrize("order", ["as-recorded", "pod-watch-first", "pytorchjobs-watch-first"])
@pytest.mark.parametrize("name", [n for n in recordings() if n not in LATE_START_ONLY])
async def test_cause_from_the_watches_whichever_lags(
    observer: list[KubeflowBackend], name: str, order: str
) -> None:
    data = load(name)
    check(name, await replay(observer, data, orders(data)[order]))


@pytest.mark.parametrize("name", recordings())
async def test_cause_for_a_process_that_starts_after_it_happened(
    observer: list[KubeflowBackend], name: str
) -> None:
    """Restarted after the pods said why and were deleted: the final objects, plus what the API server
    still knows (the pods left, the events), give the same cause."""
    data = load(name)
    now = [
        {"resource": r, "type": "ADDED", "object": o} for r in ("pytorchjobs", "pods") for o in final(data, r)
    ]
    check(name, await replay(observer, data, now, born=late_clock(data)), late=True)


def all_pods() -> list[tuple[str, Body]]:
    return [(n, e["object"]) for n in recordings() for e in load(n)["stream"] if e["resource"] == "pods"]


@pytest.mark.parametrize(
    ("reason", "kind"),
    [("PreemptionByScheduler", CauseKind.PREEMPTED), ("DeletionByTaintManager", CauseKind.NODE_LOST)],
)
def test_every_recorded_disruption_is_final_evidence(reason: str, kind: CauseKind) -> None:
    found = 0
    for _, pod in all_pods():
        conditions = {c["type"]: c for c in pod["status"].get("conditions") or []}
        if (conditions.get("DisruptionTarget") or {}).get("reason") != reason:
            continue
        found += 1
        for in_place in (True, False):
            evidence, _ = pod_evidence(
                pod, restarts_in_place=in_place, now=0.0, no_capacity_after_seconds=300
            )
            assert evidence is not None
            assert evidence.terminal
            assert evidence.cause.kind is kind
    if not found:
        pytest.skip(f"no recording has a pod with DisruptionTarget {reason}")


def test_restarting_condition_is_not_what_the_adapter_reads() -> None:
    """The real operator's Restarting condition races Running (Go map order) and has two messages:
    the recordings show it, and the causes above come from the pods, never from it."""
    messages = {
        c.get("message", "").split(" is restarting")[0].split()[0]
        for n in recordings()
        for e in load(n)["stream"]
        if e["resource"] == "pytorchjobs"
        for c in e["object"].get("status", {}).get("conditions") or []
        if c["type"] == "Restarting"
    }
    if not messages:
        pytest.skip("no recording shows a Restarting condition")
    assert messages <= {"PyTorchJob", "job"}


@pytest.mark.parametrize("name", [n for n in ("oom-never", "exit-never") if n in recordings()])
def test_under_never_the_failed_pod_stays_as_evidence(name: str) -> None:
    """Built without backoffLimit, a Never PyTorchJob fails by replica accounting and cleanPodPolicy
    Running keeps its failed pod (with a backoffLimit, even 0, the operator deletes every pod)."""
    data = load(name)
    pj = final(data, "pytorchjobs")[0]
    assert "backoffLimit" not in pj["spec"]["runPolicy"]
    failed = {c["type"]: c for c in pj["status"]["conditions"]}["Failed"]
    assert "replica(s) failed" in failed["message"]
    kept = [p for p in final(data, "pods") if not p["metadata"].get("deletionTimestamp")]
    assert [p["status"]["phase"] for p in kept] == ["Failed"]


async def test_an_ended_object_whose_pods_still_run_is_terminating(observer: list[KubeflowBackend]) -> None:
    """preempt-never: the training operator fails the job while cleanPodPolicy's deletion of the
    master is still in its grace period; the object is ended (preempted) but terminating until the
    master's pod is gone, so the job cannot settle before that."""
    data = load("preempt-never")
    stream = data["stream"]
    failed_at = next(
        i
        for i, e in enumerate(stream)
        if e["resource"] == "pytorchjobs"
        and any(c["type"] == "Failed" for c in e["object"].get("status", {}).get("conditions") or [])
    )
    running_master = next(
        i
        for i, e in enumerate(stream)
        if i > failed_at
        and e["object"]["metadata"]["name"].endswith("-master-0")
        and e["object"]["metadata"].get("deletionTimestamp")
        and e["object"]["status"]["phase"] == "Running"
    )
    early = await replay(observer, data, stream[: running_master + 1])
    assert early.phase is Phase.ENDED
    assert early.cause is not None
    assert early.cause.kind is CauseKind.PREEMPTED
    assert early.terminating
    done = await replay(observer, data, stream)
    assert not done.terminating


@pytest.mark.parametrize("late", [False, True], ids=["watching", "started-after"])
async def test_a_pytorchjob_deleted_by_a_person_is_retained_cancelled(
    observer: list[KubeflowBackend], late: bool
) -> None:
    """Recording ``deleted``: dispatch's finalizer holds the PyTorchJob (deletionTimestamp set, pods
    still running) until dispatch lets go. Whether this process watched it happen or starts while
    it is held, the view is the same: ended, cancelled, retained (decide records it, then ends it)."""
    data = load("deleted")
    stream = data["stream"]
    gone = next(i for i, e in enumerate(stream) if e["resource"] == "pytorchjobs" and e["type"] == "DELETED")
    held = {**data, "stream": stream[:gone]}
    events = held["stream"]
    if late:
        events = [
            {"resource": r, "type": "ADDED", "object": o}
            for r in ("pytorchjobs", "pods")
            for o in final(held, r)
        ]
    view = await replay(observer, held, events, born=late_clock(held) if late else None)
    assert view.phase is Phase.ENDED
    assert view.cancelled
    assert view.retained
    assert view.cause is not None
    assert view.cause.kind is CauseKind.NONE


def _failed(event: Body) -> bool:
    conditions = event["object"].get("status", {}).get("conditions") or []
    return event["resource"] == "pytorchjobs" and any(
        c["type"] == "Failed" and c["status"] == "True" for c in conditions
    )


@pytest.mark.parametrize("pods_deleted", [False, True], ids=["pods-left", "pods-deleted"])
async def test_past_the_restart_budget_is_ended_without_the_training_operators_failed(
    observer: list[KubeflowBackend], pods_deleted: bool
) -> None:
    """oom-onfailure: budget 1 (backoffLimit 2), and both pods restarted once: the training operator
    deletes the pods, then writes Failed. Every recorded event but that write (it can fail: its next
    pass, seeing no restarts on pods it has deleted, creates them anew) still ends the object, with
    the restarts' cause, and the adapter stops it itself after its grace."""
    data = load("oom-onfailure")
    stream = data["stream"]
    cut = next(i for i, e in enumerate(stream) if _failed(e))
    events = stream[:cut]
    if pods_deleted:
        events += [e for e in stream[cut:] if e["resource"] == "pods" and e["type"] == "DELETED"]
    view = await replay(observer, data, events)
    assert view.phase is Phase.ENDED, view
    assert view.cause is not None
    assert view.cause.kind is CauseKind.NON_ZERO_EXIT, view.cause
    assert view.restarts == 1
    (backend,) = observer
    oid = view.id
    verdict = await backend.verdicts.cached(oid, backend.cache.current(oid) or {})
    assert verdict.stop == view.cause
    assert verdict.stop_after_grace


async def test_within_the_restart_budget_is_still_running(observer: list[KubeflowBackend]) -> None:
    """oom-onfailure up to the first pod's in-place restart (1 of budget 1): running, not ended."""
    data = load("oom-onfailure")
    stream = data["stream"]

    def restarts(e: Body) -> int:
        statuses = e["object"].get("status", {}).get("containerStatuses") or [{}]
        return int(statuses[0].get("restartCount") or 0) if e["resource"] == "pods" else 0

    first = next(i for i, e in enumerate(stream) if restarts(e) == 1)
    view = await replay(observer, data, stream[: first + 1])
    assert view.phase is Phase.RUNNING, view
    assert view.restarts == 1


async def test_settling_waits_for_the_stop_past_the_budget(observer: list[KubeflowBackend]) -> None:
    """The stop past the budget is deferred (the training operator normally ends the object
    first), but not left to it: settling (``quiesce``) waits for it. The recording's API refuses
    every write, so a quiesce that waits for the stop fails, one that does not returns."""
    data = load("oom-onfailure")
    stream = data["stream"]
    cut = next(i for i, e in enumerate(stream) if _failed(e))

    def make(api: Any, *, stop_ended: bool, clock: Any) -> KubeflowBackend:
        return KubeflowBackend(api, clock=clock, stop_grace=0.01)  # stops written, after a short grace

    view = await recorded.replay(make, observer, data, stream[:cut], resource="pytorchjobs")
    assert view.phase is Phase.ENDED
    with pytest.raises(TransientBackendError, match="stop kubeflow-record/oom-onfailure-1"):
        await observer[0].quiesce(view.job)


def test_a_pod_no_node_takes_is_named_after_a_few_seconds_until_it_is_no_capacity() -> None:
    """Recording ``unschedulable`` with a wait of 600 s: for WAITING_AFTER the view says nothing
    (a preemptor waiting for its victims passes without a status write), then it names the pod,
    kube-scheduler's words and when the wait becomes no-capacity, the same text at every later
    look (a restarted operator writes nothing), and the kit looks again exactly when each is due."""
    data = load("unschedulable")
    pj = final(data, "pytorchjobs")[0]
    annotations = {**pj["metadata"]["annotations"], "dispatch.dev/no-capacity-after-seconds": "600"}
    pj = {**pj, "metadata": {**pj["metadata"], "annotations": annotations}}
    pod = final(data, "pods")[0]
    scheduled = next(c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")
    since = parse_time(scheduled["lastTransitionTime"])
    assert since is not None

    early = classify(PYTORCHJOB, pj, [pod], now=since + 1)
    assert early.view.phase is Phase.QUEUED
    assert early.view.waiting == ""
    assert early.recheck_at == since + WAITING_AFTER

    due = classify(PYTORCHJOB, pj, [pod], now=since + WAITING_AFTER)
    assert due.view.phase is Phase.QUEUED
    assert due.view.waiting.startswith(f"pod {pod['metadata']['name']} unschedulable (no-capacity at ")
    assert "Insufficient nvidia.com/gpu" in due.view.waiting, due.view.waiting
    assert due.recheck_at == since + 600
    assert classify(PYTORCHJOB, pj, [pod], now=since + 599).view.waiting == due.view.waiting

    ended = classify(PYTORCHJOB, pj, [pod], now=since + 600).view
    assert ended.phase is Phase.ENDED
    assert ended.cause is not None
    assert ended.cause.kind is CauseKind.NO_CAPACITY

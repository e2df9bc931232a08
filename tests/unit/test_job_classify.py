"""Classification of batch/v1 Jobs on Job and Pod JSON recorded from the real stack, table-style.

Each file in tests/unit/data/job/ (recorded by hack/record.py job from the lab: the real
kube-apiserver, kube-scheduler, kube-controller-manager with its Job controller, and kwok; the
``real-*`` ones watched on the lab's real node instead of kwok, see EXPECTED) holds the
watch events of one Job and its pods, in arrival order, and the events Kubernetes wrote. The `job`
backend's own watch handlers are fed those events, and its ``list()`` must give the cause the table
says: in the recorded order, with either watch lagging the other, and in a process that starts only
after it all happened (the final objects, and reads answered from the same recording).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dispatch._backends.job._adapter import JOB, JobBackend
from dispatch._model import CauseKind, ObjectView, Phase
from dispatch._workload import WorkloadBackend, classify
from tests.support.classified import assert_classified
from tests.support.recorded import final, late_clock, load, names, orders, replay, restarted

DATA = Path(__file__).parent / "data" / "job"
Body = dict[str, Any]

# scenario -> (phase, cause, exit code, a word of the detail, restarts)
EXPECTED: dict[str, tuple[Phase, CauseKind, int | None, str, int]] = {
    "success": (Phase.ENDED, CauseKind.NONE, None, "succeeded pods", 0),
    "success-indexed": (Phase.ENDED, CauseKind.NONE, None, "succeeded pods", 0),
    "exit-never": (Phase.ENDED, CauseKind.NON_ZERO_EXIT, 3, "exited with code 3", 0),
    "oom-never": (Phase.ENDED, CauseKind.OUT_OF_MEMORY, 137, "OOMKilled", 0),
    "preempt-never": (Phase.ENDED, CauseKind.PREEMPTED, None, "Preempt", 0),
    "restart-native": (Phase.ENDED, CauseKind.NONE, None, "succeeded pods", 1),
    "restart-exhausted": (Phase.ENDED, CauseKind.OUT_OF_MEMORY, 137, "backoff limit", 1),
    "preempt-native": (Phase.ENDED, CauseKind.PREEMPTED, None, "Preempt", 0),
    "unschedulable": (Phase.ENDED, CauseKind.NO_CAPACITY, None, "Insufficient nvidia.com/gpu", 0),
    "image-pull": (Phase.ENDED, CauseKind.LAUNCH_FAILED, None, "ErrImagePull", 0),
    # From the lab's real node (kubelet, containerd, runc), watched while
    # tests/integration/test_real_node_causes.py ran (each file says which test).
    "real-preempt-exit0": (Phase.ENDED, CauseKind.PREEMPTED, None, "PreemptionByScheduler", 0),
    "real-segv": (Phase.ENDED, CauseKind.NON_ZERO_EXIT, 139, "exited with code 139", 0),
    "real-unpullable": (Phase.ENDED, CauseKind.LAUNCH_FAILED, None, "no such host", 0),
    "real-start-error": (Phase.ENDED, CauseKind.LAUNCH_FAILED, 128, "/no/such/program", 0),
    "real-evicted": (Phase.ENDED, CauseKind.UNKNOWN, None, "exceeds the limit", 0),
}


def recordings() -> list[str]:
    return names(DATA, EXPECTED)


def check(name: str, view: ObjectView) -> None:
    assert_classified(view, EXPECTED[name])


def test_every_scenario_is_recorded() -> None:
    assert recordings() == sorted(EXPECTED)


@pytest.mark.parametrize("order", ["as-recorded", "pod-watch-first", "jobs-watch-first"])
@pytest.mark.parametrize("name", recordings())
async def test_cause_from_the_watches_whichever_lags(
    observer: list[WorkloadBackend], name: str, order: str
) -> None:
    data = load(DATA, name)
    check(name, await replay(JobBackend, observer, data, orders(data, "jobs")[order], resource="jobs"))


@pytest.mark.parametrize("name", recordings())
async def test_cause_for_a_process_that_starts_after_it_happened(
    observer: list[WorkloadBackend], name: str
) -> None:
    data = load(DATA, name)
    view = await replay(
        JobBackend, observer, data, restarted(data, "jobs"), resource="jobs", born=late_clock(data)
    )
    check(name, view)


@pytest.mark.parametrize("name", [n for n in ("restart-native", "restart-exhausted") if n in recordings()])
def test_a_replaced_pod_is_a_restart_not_an_end(name: str) -> None:
    """Under the native rule the Job controller replaces the pod that exited 1: while the replacement
    runs, the Job is running with one restart, and nothing tells the kit to stop it."""
    data = load(DATA, name)
    stream = data["stream"]
    pods: dict[str, Body] = {}
    for event in stream:
        if event["resource"] != "pods":
            continue
        pods[event["object"]["metadata"]["name"]] = event["object"]
        phases = sorted(p["status"].get("phase", "") for p in pods.values())
        if phases == ["Failed", "Running"]:
            break
    else:
        pytest.fail("no moment with the failed pod and its running replacement")
    job = next(e["object"] for e in stream if e["resource"] == "jobs" and not e["object"]["spec"]["suspend"])
    verdict = classify(JOB, job, list(pods.values()), now=late_clock(data))
    assert verdict.stop is None
    assert verdict.view.phase is Phase.RUNNING
    assert verdict.view.restarts == 1


def test_the_native_rule_is_the_job_controllers_own_reason() -> None:
    """restart-exhausted ends by the Job controller's backoff limit; preempt-native by the pod
    failure policy's FailJob rule (a disruption is never counted)."""
    reasons = {}
    for name in ("restart-exhausted", "preempt-native"):
        if name not in recordings():
            pytest.skip(f"{name} not recorded")
        job = final(load(DATA, name), "jobs")[0]
        failed = {c["type"]: c for c in job["status"]["conditions"]}["Failed"]
        reasons[name] = failed["reason"]
    assert reasons == {"restart-exhausted": "BackoffLimitExceeded", "preempt-native": "PodFailurePolicy"}


async def test_a_job_deleted_by_a_person_is_retained_cancelled(observer: list[WorkloadBackend]) -> None:
    """Recording ``deleted``: dispatch's finalizer holds the Job until dispatch lets go; the view is
    ended, cancelled and retained (decide records it, then ends it)."""
    data = load(DATA, "deleted")
    stream = data["stream"]
    gone = next(i for i, e in enumerate(stream) if e["resource"] == "jobs" and e["type"] == "DELETED")
    held = {**data, "stream": stream[:gone]}
    view = await replay(JobBackend, observer, held, held["stream"], resource="jobs")
    assert view.phase is Phase.ENDED
    assert view.cancelled
    assert view.retained


async def test_the_failure_past_the_budget_ends_the_job_before_its_controller_says_so(
    observer: list[WorkloadBackend],
) -> None:
    """restart-exhausted (budget 1 = backoffLimit 1): the second failed pod is one failure more than
    the budget; before the Job controller's FailureTarget and Failed (left out here, as a lost
    write would leave them) the kit ends the Job with that pod's cause and stops it after its
    grace (the Job controller's own end normally comes first)."""
    data = load(DATA, "restart-exhausted")
    stream = data["stream"]
    cut = next(
        i
        for i, e in enumerate(stream)
        if e["resource"] == "jobs"
        and any(
            c["type"] in ("FailureTarget", "Failed") for c in e["object"]["status"].get("conditions") or []
        )
    )
    view = await replay(JobBackend, observer, data, stream[:cut], resource="jobs")
    assert view.phase is Phase.ENDED, view
    assert view.cause is not None
    assert view.cause.kind is CauseKind.OUT_OF_MEMORY, view.cause
    assert view.cause.exit_code == 137
    assert view.restarts == 1
    (backend,) = observer
    verdict = await backend.verdicts.cached(view.id, backend.cache.current(view.id) or {})
    assert verdict.stop == view.cause
    assert verdict.stop_after_grace


def test_a_pod_done_before_its_disruption_leaves_the_jobs_success() -> None:
    """real-preempt-exit0 (the real node): the program exited 0 on its preemption's SIGTERM, so
    its pod is Succeeded with a DisruptionTarget set before it ended, and the Job is Complete:
    preempted. The same pod finished before the condition was set (a finished pod deleted
    afterwards) leaves the Job's success."""
    data = load(DATA, "real-preempt-exit0")
    job = final(data, "jobs")[0]
    (pod,) = final(data, "pods")
    earlier = json.loads(json.dumps(pod))
    earlier["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"] = "2000-01-01T00:00:00Z"
    causes = [classify(JOB, job, [p], now=late_clock(data)).view.cause for p in (pod, earlier)]
    assert [c.kind if c else None for c in causes] == [CauseKind.PREEMPTED, CauseKind.NONE]

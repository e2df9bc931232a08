"""Classification of JobSets on JobSet, Job and Pod JSON recorded from the real stack, table-style.

Each file in tests/unit/data/jobset/ (recorded by hack/record.py jobset from the lab: the real
kube-apiserver, kube-scheduler, kube-controller-manager's Job controller, kwok and JobSet v0.11.1
with its webhooks) holds the watch events of one JobSet, its child Jobs and its pods, in arrival
order, and the events Kubernetes wrote. The `jobset` backend's own watch handlers are fed the
JobSet's and the pods' events, and its ``list()`` must give the cause the table says: in the
recorded order, with either watch lagging the other, and in a process that starts only after it
all happened.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dispatch._backends.jobset._adapter import JOBSET, JobSetBackend
from dispatch._model import CauseKind, ObjectView, Phase
from dispatch._workload import WorkloadBackend, classify
from tests.support.classified import assert_classified
from tests.support.recorded import final, late_clock, load, names, orders, replay, restarted, watched

DATA = Path(__file__).parent / "data" / "jobset"
RESOURCE = "jobsets.jobset.x-k8s.io"
Body = dict[str, Any]

# scenario -> (phase, cause, exit code, a word of the detail, restarts)
EXPECTED: dict[str, tuple[Phase, CauseKind, int | None, str, int]] = {
    "success": (Phase.ENDED, CauseKind.NONE, None, "jobset completed successfully", 0),
    "exit": (Phase.ENDED, CauseKind.NON_ZERO_EXIT, 1, "exited with code 1", 0),
    "oom": (Phase.ENDED, CauseKind.OUT_OF_MEMORY, 137, "OOMKilled", 0),
    "preempt": (Phase.ENDED, CauseKind.PREEMPTED, None, "Preempt", 0),
    "evict": (Phase.ENDED, CauseKind.PREEMPTED, None, "EvictionByEvictionAPI", 0),
    "restarts-exhausted": (Phase.ENDED, CauseKind.NON_ZERO_EXIT, 1, "exited with code 1", 1),
    "restart-success": (Phase.ENDED, CauseKind.NONE, None, "jobset completed successfully", 1),
}

LATE: dict[str, tuple[Phase, CauseKind, int | None, str, int]] = {
    # The evicted pod is deleted with the failed JobSet's Jobs, and the Eviction API writes no Event:
    # a process that starts afterwards has only the JobSet's "first failed job" to go by.
    "evict": (Phase.ENDED, CauseKind.UNKNOWN, None, "FailJobSetFailurePolicyAction", 0),
}


def recording(name: str) -> Body:
    return watched(DATA, name, RESOURCE)


def recordings() -> list[str]:
    return names(DATA)


def check(name: str, view: ObjectView, *, late: bool = False) -> None:
    assert_classified(view, (LATE if late else EXPECTED).get(name, EXPECTED[name]))


def test_every_scenario_is_recorded() -> None:
    assert recordings() == sorted(EXPECTED)


@pytest.mark.parametrize("order", ["as-recorded", "pod-watch-first", f"{RESOURCE}-watch-first"])
@pytest.mark.parametrize("name", sorted(EXPECTED))
async def test_cause_from_the_watches_whichever_lags(
    observer: list[WorkloadBackend], name: str, order: str
) -> None:
    data = recording(name)
    check(name, await replay(JobSetBackend, observer, data, orders(data, RESOURCE)[order], resource=RESOURCE))


@pytest.mark.parametrize("name", sorted(EXPECTED))
async def test_cause_for_a_process_that_starts_after_it_happened(
    observer: list[WorkloadBackend], name: str
) -> None:
    data = recording(name)
    view = await replay(
        JobSetBackend, observer, data, restarted(data, RESOURCE), resource=RESOURCE, born=late_clock(data)
    )
    check(name, view, late=True)


def test_the_native_rule_is_jobsets_own() -> None:
    """Without the native rule a failed Job fails the JobSet at once (FailJobSet); with it, an exit
    restarts the JobSet (status.restarts 1, every pod recreated with restart-attempt 1) until
    maxRestarts, then ReachedMaxRestarts: JobSet's failure policy, not dispatch, did both."""
    reasons = {}
    for name in ("exit", "preempt", "restarts-exhausted"):
        jobset = final(load(DATA, name), RESOURCE)[0]
        failed = {c["type"]: c for c in jobset["status"]["conditions"]}["Failed"]
        reasons[name] = (failed["reason"], jobset["status"].get("restarts", 0))
    assert reasons == {
        "exit": ("FailJobSetFailurePolicyAction", 0),
        "preempt": ("FailJobSetFailurePolicyAction", 0),
        "restarts-exhausted": ("ReachedMaxRestarts", 1),
    }
    attempts = {
        e["object"]["metadata"]["labels"]["jobset.sigs.k8s.io/restart-attempt"]
        for e in load(DATA, "restarts-exhausted")["stream"]
        if e["resource"] == "pods"
    }
    assert attempts == {"0", "1"}


def test_a_restart_by_jobset_is_not_an_end() -> None:
    """While the restarted JobSet's new pods run, the view is running with one restart, and nothing
    tells the kit to stop it (the failed pod of attempt 0 is the restart's cause)."""
    data = recording("restart-success")
    pods: dict[str, Body] = {}
    jobset: Body | None = None
    for event in data["stream"]:
        obj = event["object"]
        if event["resource"] == RESOURCE:
            jobset = obj
            continue
        if event["type"] == "DELETED":
            pods.pop(obj["metadata"]["name"], None)
        else:
            pods[obj["metadata"]["name"]] = obj
        running = [
            p
            for p in pods.values()
            if p["metadata"]["labels"]["jobset.sigs.k8s.io/restart-attempt"] == "1"
            and p["status"].get("phase") == "Running"
        ]
        if len(running) == 2:
            break
    else:
        pytest.fail("no moment with the restarted JobSet's pods running")
    assert jobset is not None
    failed = [p for p in pods.values() if p["status"].get("phase") == "Failed"]
    verdict = classify(JOBSET, jobset, [*failed, *running], now=late_clock(data))
    assert verdict.stop is None, verdict
    assert verdict.view.phase is Phase.RUNNING, verdict

"""What the operator tells a kit backend about a job it did not create the objects of (after a
restart): the plan's resubmitted causes (``learn``), and where ownerReferences come from
(``use_owner``: the record store knows each DispatchJob's uid, so no GET per create).

The API here answers reads from an empty recording and refuses every write (``RecordedApi``): a
list() that waits for a stop's write fails, one that does not wait returns.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

from dispatch import CauseKind, JobSpec, KubeflowOptions, Phase, RecoveryPolicy, Rule, make_plan
from dispatch._errors import TransientBackendError
from dispatch._kubeflow import CAPABILITIES, KubeflowBackend
from dispatch._workload import WorkloadBackend
from tests.support.recorded import RecordedApi
from tests.unit.test_kit_events_watch import pytorchjob

JOB = "team/train"


def spec_with(*causes: CauseKind) -> JobSpec:
    return JobSpec(
        name="train",
        command=("python", "train.py"),
        recovery=RecoveryPolicy(rules=(Rule(on=causes, budget=1),) if causes else ()),
        kubeflow=KubeflowOptions(image="example.invalid/train:1"),
    )


def preempted_pod() -> dict[str, Any]:
    """The running master of team/train-1, marked by kube-scheduler for preemption."""
    return {
        "metadata": {
            "name": "train-1-master-0",
            "namespace": "team",
            "uid": "pod-1",
            "resourceVersion": "20",
            "labels": {
                "dispatch.dev/job": "train",
                "dispatch.dev/submission": "1",
                "app.kubernetes.io/managed-by": "dispatch",
            },
        },
        "spec": {"nodeName": "kwok-node-0"},
        "status": {
            "phase": "Running",
            "conditions": [
                {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": "PreemptionByScheduler",
                    "message": "default-scheduler: preempting to accommodate a higher priority pod",
                    "lastTransitionTime": "2026-12-01T12:05:00Z",
                }
            ],
        },
    }


def restarted_kit(observer: list[WorkloadBackend]) -> tuple[WorkloadBackend, RecordedApi]:
    """A kit backend that finds team/train-1 running with its master preempted: an object it did
    not create, which it must stop (the training operator would go on)."""
    api = RecordedApi({"stream": [], "events": []})
    backend = KubeflowBackend(api, clock=lambda: 1.8e9)  # type: ignore[arg-type]
    backend._tasks = [asyncio.get_running_loop().create_task(asyncio.sleep(3600))]  # no informer runs
    observer.append(backend)
    backend._object_changed(None, pytorchjob(ended=False))
    backend._pod_changed(None, preempted_pod())
    return backend, api


@pytest.mark.parametrize("covered", [True, False])
async def test_a_learned_plan_lets_the_first_list_skip_the_wait_for_a_resubmitted_cause(
    observer: list[WorkloadBackend], covered: bool
) -> None:
    backend, api = restarted_kit(observer)
    spec = spec_with(CauseKind.PREEMPTED if covered else CauseKind.NO_CAPACITY)
    backend.learn(JOB, spec, make_plan(JOB, spec, CAPABILITIES, supervised=True))
    backend.subscribe(JOB, lambda: None)
    if not covered:
        # An outcome comes next: the list waits for the stop (which this API refuses).
        with pytest.raises(TransientBackendError):
            await backend.list(JOB)
        return
    [view] = await backend.list(JOB)
    assert view.phase is Phase.ENDED
    assert view.cause is not None
    assert view.cause.kind is CauseKind.PREEMPTED
    assert not [c for c in api.calls if not c.startswith("GET")]


async def test_without_learning_the_plan_the_first_list_waits_for_the_stop(
    observer: list[WorkloadBackend],
) -> None:
    backend, _ = restarted_kit(observer)
    with pytest.raises(TransientBackendError):
        await backend.list(JOB)


async def test_the_learned_plan_is_dropped_with_the_jobs_last_subscriber(
    observer: list[WorkloadBackend],
) -> None:
    backend, _ = restarted_kit(observer)
    spec = spec_with(CauseKind.PREEMPTED)
    unsubscribe = backend.subscribe(JOB, lambda: None)
    backend.learn(JOB, spec, make_plan(JOB, spec, CAPABILITIES, supervised=True))
    other = spec_with(CauseKind.PREEMPTED)
    backend.learn("team/other", other, make_plan("team/other", other, CAPABILITIES, supervised=True))
    assert backend._resubmits[JOB] is backend._resubmits["team/other"]  # one copy of each set
    unsubscribe()
    assert JOB not in backend._resubmits


async def test_the_owner_lookup_given_is_the_one_create_uses(observer: list[WorkloadBackend]) -> None:
    api = RecordedApi({"stream": [], "events": []})
    backend = KubeflowBackend(api)  # type: ignore[arg-type]
    backend._tasks = [asyncio.get_running_loop().create_task(asyncio.sleep(3600))]  # no informer runs
    observer.append(backend)
    asked: list[tuple[str, str]] = []

    async def known(_: Any, namespace: str, name: str) -> Mapping[str, Any]:
        asked.append((namespace, name))
        return {"apiVersion": "dispatch.dev/v1alpha1", "kind": "DispatchJob", "name": name, "uid": "u"}

    backend.use_owner(known)
    spec = spec_with(CauseKind.PREEMPTED)
    with pytest.raises(AssertionError, match="a read-only observer wrote: POST"):
        await backend.create(JOB, 1, spec, make_plan(JOB, spec, CAPABILITIES, supervised=True))
    assert asked == [("team", "train")]
    assert not [c for c in api.calls if "dispatchjobs" in c]  # no GET of the DispatchJob


async def test_the_plan_an_object_was_created_with_wins_over_the_learned_one(
    observer: list[WorkloadBackend],
) -> None:
    """An object created by this process after its job's last preemption budget was spent: that
    end is an outcome, so the list waits for the stop though the plan learned at the start said
    resubmit."""
    backend, _ = restarted_kit(observer)
    spec = spec_with(CauseKind.PREEMPTED)
    backend.learn(JOB, spec, make_plan(JOB, spec, CAPABILITIES, supervised=True))
    backend._state("team/train-1").resubmits = frozenset()  # as create() records a spent budget
    with pytest.raises(TransientBackendError):
        await backend.list(JOB)

"""A kit backend after a restart of the operator, with a job whose objects it did not create: a
stop in flight is shown ended at once and waited for only before settling (``quiesce``), and where
ownerReferences come from (``use_owner``: the record store knows each DispatchJob's uid, so no GET
per create).

The API here answers reads from an empty recording and refuses every write (``RecordedApi``): a
call that waits for a stop's write fails, one that does not wait returns.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

from dispatch import CauseKind, JobSpec, KubeflowOptions, Phase, RecoveryPolicy, Rule, make_plan
from dispatch._backends.kubeflow._adapter import CAPABILITIES, KubeflowBackend
from dispatch._errors import TransientBackendError
from dispatch._workload import WorkloadBackend
from tests.support.kit import JOB, restarted_kit
from tests.support.recorded import RecordedApi


def spec_with(*causes: CauseKind) -> JobSpec:
    return JobSpec(
        name="train",
        command=("python", "train.py"),
        recovery=RecoveryPolicy(rules=(Rule(on=causes, budget=1),) if causes else ()),
        kubeflow=KubeflowOptions(image="example.invalid/train:1"),
    )


async def test_a_list_shows_a_stop_in_flight_ended_without_waiting_for_it(
    observer: list[WorkloadBackend],
) -> None:
    """Whatever comes next (a new submission or an outcome), the supervisor decides it now; only
    settling must wait for the stop (below)."""
    backend, api = restarted_kit(observer)
    backend.subscribe(JOB, lambda: None)
    [view] = await backend.list(JOB)
    assert view.phase is Phase.ENDED
    assert view.cause is not None
    assert view.cause.kind is CauseKind.PREEMPTED
    assert not [c for c in api.calls if not c.startswith("GET")]


async def test_quiesce_waits_for_the_stop_and_raises_when_it_cannot_land(
    observer: list[WorkloadBackend],
) -> None:
    backend, _ = restarted_kit(observer)
    backend.subscribe(JOB, lambda: None)
    await backend.list(JOB)
    with pytest.raises(TransientBackendError, match="stop team/train-1"):
        await backend.quiesce(JOB)


async def test_the_owner_lookup_given_is_the_one_create_uses(observer: list[WorkloadBackend]) -> None:
    api = RecordedApi({"stream": [], "events": []})
    backend = KubeflowBackend(api)  # type: ignore[arg-type]
    backend.watches.tasks = [asyncio.get_running_loop().create_task(asyncio.sleep(3600))]  # no informer runs
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

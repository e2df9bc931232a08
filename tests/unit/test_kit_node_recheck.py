"""The workload kit looks a node up again by itself when a verdict depends on it.

A pod being deleted without a ``DisruptionTarget`` (or terminated by its kubelet) ran on a node that
is lost only if the node says so, and nodes are not watched: no event tells the kit when it goes
NotReady. The operator's loop no longer looks at the kit's jobs periodically (the kit is
``SelfWaking``), so the kit wakes the job once the lookup has expired from its node cache.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dispatch import CauseKind, Phase
from dispatch._backends.kubeflow._adapter import KubeflowBackend
from dispatch._protocols import SelfWaking
from dispatch._workload import WorkloadBackend
from dispatch._workload import _verdicts as kit_backend
from tests.support.kit import preempted_pod, pytorchjob
from tests.support.recorded import RecordedApi

JOB = "team/train"
NODE = "kwok-node-0"  # where preempted_pod runs


def deleted_pod() -> dict[str, Any]:
    """The running master of team/train-1, deleted by someone: no DisruptionTarget, no exit yet."""
    pod = preempted_pod()
    pod["metadata"]["deletionTimestamp"] = "2026-12-01T12:05:00Z"
    pod["status"] = {"phase": "Running"}
    return pod


async def test_a_verdict_that_needs_a_node_wakes_the_job_when_the_lookup_expires(
    observer: list[WorkloadBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kit_backend, "NODE_CACHE_SECONDS", 0.05)
    api = RecordedApi({"stream": [], "events": []})
    backend = KubeflowBackend(api)  # type: ignore[arg-type]
    backend.watches.tasks = [asyncio.get_running_loop().create_task(asyncio.sleep(3600))]  # no informer runs
    observer.append(backend)
    assert isinstance(backend, SelfWaking)
    assert backend.wakes_itself
    backend.watches.object_changed(None, backend.cache.packed(pytorchjob(ended=False)))
    backend.watches.pod_changed(None, backend.cache.packed_pod(deleted_pod()))
    woken = asyncio.Event()
    backend.subscribe(JOB, woken.set)

    [view] = await backend.list(JOB)
    assert view.phase is not Phase.ENDED  # the node is Ready: its kubelet will end the pod
    assert f"GET /api/v1/nodes/{NODE}" in api.calls

    api.nodes[NODE] = {"status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}}
    await asyncio.wait_for(woken.wait(), 10)  # nothing else changed: the kit's own timer
    [view] = await backend.list(JOB)
    assert view.phase is Phase.ENDED
    assert view.cause is not None
    assert view.cause.kind is CauseKind.NODE_LOST, view.cause

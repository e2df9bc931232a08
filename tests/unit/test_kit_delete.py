"""The kit's own delete of an object its finalizer holds shows at once in its cache: the object is
``retained`` in the next list(), so the supervisor ends it (lets go of the finalizer) before it
records the job settled. Read from the watch alone, a list() taken before the watch brought the
deletion showed it merely ended; the job settled, nothing let go of the object, and its Kueue
Workload was admitted again (tests/integration/test_kueue.py, once in a clean-clone run)."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from dispatch._backends.kubeflow._adapter import KubeflowBackend
from dispatch._constants import OBJECT_FINALIZER
from dispatch._workload import WorkloadBackend
from tests.support.kit import pytorchjob
from tests.support.recorded import JsonResponse, RecordedApi

JOB = "team/train"
OID = "team/train-1"


def kit_whose_delete_answers(answer: dict[str, Any], observer: list[WorkloadBackend]) -> KubeflowBackend:
    api = RecordedApi({"stream": [], "events": []})
    reads = api.call_api

    async def call_api(path: str, method: str, **options: Any) -> Any:
        if method == "DELETE":
            return JsonResponse(200, answer)
        return await reads(path, method, **options)

    api.call_api = call_api  # type: ignore[method-assign]
    backend = KubeflowBackend(api)  # type: ignore[arg-type]
    backend.watches.tasks = [asyncio.get_running_loop().create_task(asyncio.sleep(3600))]  # no informer runs
    observer.append(backend)
    body = pytorchjob()  # ended by its controller
    body["metadata"]["finalizers"] = [OBJECT_FINALIZER]
    backend.watches.object_changed(None, backend.cache.packed(body))
    backend.subscribe(JOB, lambda: None)
    return backend


def deleted(*, finalizers: list[str]) -> dict[str, Any]:
    body = copy.deepcopy(pytorchjob())
    body["metadata"].update(
        resourceVersion="11", deletionTimestamp="2026-12-01T12:06:00Z", finalizers=finalizers
    )
    return body


async def test_a_delete_our_finalizer_holds_shows_the_object_retained_at_once(
    observer: list[WorkloadBackend],
) -> None:
    backend = kit_whose_delete_answers(deleted(finalizers=[OBJECT_FINALIZER]), observer)
    [before] = await backend.list(JOB)
    assert not before.retained
    await backend.objects.delete("team", "train-1")
    [after] = await backend.list(JOB)
    assert after.retained


async def test_a_delete_that_nothing_holds_is_left_to_the_watch(observer: list[WorkloadBackend]) -> None:
    """Gone at once (no finalizer): its DELETED event may already be in, so nothing is remembered
    that could bring a deleted object back."""
    backend = kit_whose_delete_answers(deleted(finalizers=[]), observer)
    await backend.objects.delete("team", "train-1")
    current = backend.cache.current(OID)
    assert current is not None
    assert not current["metadata"].get("deletionTimestamp")

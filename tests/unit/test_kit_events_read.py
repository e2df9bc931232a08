"""The kit reads a namespace's disruption Events once for all the lookups that need them at once.

After a mass preemption every supervision worker looks for evidence at the same moment; each used to
LIST and parse the namespace's Events itself (bench-operator: 55% of the operator's CPU at 1,000
jobs). One read in flight per namespace serves them all, and its answer is kept a few seconds.
Since the Events watches (tests/unit/test_kit_events_watch.py) this read is only the fallback until
those watches have listed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from dispatch._backends.kubeflow._adapter import PYTORCHJOB
from dispatch._errors import BackendError
from dispatch._workload import WorkloadBackend
from dispatch._workload._evidence import evidence_events
from tests.support.recorded import JsonResponse

EVENT = {"metadata": {"name": "e1", "namespace": "team"}, "reason": "Preempted"}


class EventsApi:
    """Answers the Events LIST (slowly, as a loaded API server does) and counts each one."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.reads = 0

    async def call_api(
        self, path: str, method: str, *, query_params: Iterable[tuple[str, str]], **_: Any
    ) -> Any:
        assert (method, path) == ("GET", "/api/v1/namespaces/team/events"), (method, path)
        self.reads += 1
        await asyncio.sleep(0.05)
        return JsonResponse(self.status, {"items": [EVENT]} if self.status == 200 else {"message": "busy"})


async def test_concurrent_lookups_share_one_read_of_the_events() -> None:
    api = EventsApi()
    backend = WorkloadBackend(PYTORCHJOB, api, owner=None)  # type: ignore[arg-type]
    per_read = len(evidence_events(PYTORCHJOB))
    answers = await asyncio.gather(*(backend.cache.events.disruption_events("team") for _ in range(32)))
    assert api.reads == per_read  # one LIST per (kind, reason) the kind reads, not 32 of each
    assert all(a == [EVENT] * per_read for a in answers)
    await backend.cache.events.disruption_events("team")  # kept a few seconds: no read
    assert api.reads == per_read


async def test_a_failed_read_fails_every_waiter_and_the_next_lookup_reads_again() -> None:
    api = EventsApi(status=503)
    backend = WorkloadBackend(PYTORCHJOB, api, owner=None)  # type: ignore[arg-type]
    results = await asyncio.gather(
        *(backend.cache.events.disruption_events("team") for _ in range(4)), return_exceptions=True
    )
    assert all(isinstance(r, BackendError) for r in results), results
    assert api.reads == 1
    api.status = 200
    assert await backend.cache.events.disruption_events("team") == [EVENT] * len(evidence_events(PYTORCHJOB))
    assert api.reads == 1 + len(evidence_events(PYTORCHJOB))

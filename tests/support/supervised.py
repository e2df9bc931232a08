"""The library supervisor on a real backend, as the integration tests run it: a record stored for
the supervisor to take, and waiting (on the backend's wakes, never polling) for an object to run.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from dispatch import Backend, Capabilities, JobSpec, MemoryStore, Phase, Record, make_plan
from dispatch._model import SUPERVISOR


async def stored(job: str, spec: JobSpec, capabilities: Capabilities) -> tuple[MemoryStore, Record]:
    """A MemoryStore holding ``job`` submitted now with ``spec``, planned for ``capabilities`` and
    supervised: what ``Supervisor(backend, store).run(job)`` starts from."""
    record = Record(
        job=job,
        spec=spec,
        plan=make_plan(job, spec, capabilities, supervised=True),
        submitted_by=SUPERVISOR,
        submitted_at=datetime.now(UTC),
        supervised=True,
    )
    store = MemoryStore()
    await store.create(record)
    return store, record


async def running(backend: Backend, job: str, object_id: str) -> None:
    """Until the backend lists ``object_id`` of ``job`` as running (woken by the backend)."""
    woken = asyncio.Event()
    unsubscribe = backend.subscribe(job, woken.set)
    try:
        while True:
            woken.clear()
            if any(v.id == object_id and v.phase is Phase.RUNNING for v in await backend.list(job)):
                return
            await woken.wait()
    finally:
        unsubscribe()

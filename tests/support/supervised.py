"""The library supervisor on a real backend, as the integration tests run it: a record stored for
the supervisor to take, and waiting (on the backend's wakes, never polling) for an object to run.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from dispatch import (
    Actor,
    ActorKind,
    Backend,
    Capabilities,
    Cluster,
    JobSpec,
    MemoryBackend,
    MemoryStore,
    Phase,
    Record,
    compose,
    make_plan,
)
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


async def succeeded(backend: MemoryBackend, spec: JobSpec) -> tuple[Cluster, str]:
    """``spec`` submitted by a person to a cluster of ``backend`` (made with ``auto_run``) and run by
    the library supervisor until its first object succeeds and the job settles: the cluster and job."""
    cluster = compose(backend)
    plan = await cluster.operator.submit(spec, Actor(kind=ActorKind.HUMAN, id="ada"), supervised=True)
    changed = asyncio.Event()
    backend.subscribe(plan.job, changed.set)
    run = asyncio.create_task(cluster.supervisor().run(plan.job))
    async with asyncio.timeout(10):
        while True:
            changed.clear()
            views = await backend.list(plan.job)
            if views and views[0].phase is Phase.RUNNING:
                break
            await changed.wait()
        backend.env.complete(views[0].id)
        await run
    return cluster, plan.job

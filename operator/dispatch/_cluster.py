"""The cluster facade: a backend composed with the core, seen through two roles.

``cluster.operator`` submits and cancels (the seed's Operator role: it changes things);
``cluster.observer`` gets and watches (the Observer role: it only reads).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Mapping
from importlib.metadata import entry_points

from ._decide import decide, status
from ._errors import AdapterNotFound, VersionConflict
from ._memstore import MemoryStore
from ._model import Actor, CancelRequest, JobSpec, Plan, Record, Status
from ._plan import make_plan
from ._protocols import Backend, RecordStore
from ._supervisor import Supervisor, utcnow

ADAPTER_GROUP = "dispatch.adapters"


class Operator:
    """Submits and cancels jobs. Every call names the actor that makes it."""

    def __init__(self, backend: Backend, store: RecordStore) -> None:
        self._backend = backend
        self._store = store

    async def submit(self, spec: JobSpec, actor: Actor, *, supervised: bool = False) -> Plan:
        """Plan the job, record it, and return the plan. Nothing runs yet if ``supervised``.

        ``supervised=True`` says a supervisor will run for this job (``WithSupervisor`` in the
        seed), so rules the scheduler cannot enforce can go to it. Without it such a rule makes
        submission fail with :class:`~dispatch.PlanError`, and nothing is recorded or created. An
        unsupervised job is launched here, since no supervisor will launch it.
        """
        plan = make_plan(spec.name, spec, self._backend.capabilities, supervised=supervised)
        record = Record(
            job=spec.name,
            spec=spec,
            plan=plan,
            submitted_by=actor,
            submitted_at=utcnow(),
            supervised=supervised,
        )
        await self._store.create(record)
        if not supervised:
            await Supervisor(self._backend, self._store, actor=actor).drive(record.job)
        return plan

    async def cancel(self, job: str, actor: Actor) -> None:
        """Ask for the job to end as ``cancelled``, recording who asked. The record is kept."""
        while True:
            record, version = await self._store.get(job)
            if record.state.is_outcome or record.cancel is not None:
                break
            request = CancelRequest(actor=actor, time=utcnow())
            try:
                await self._store.put(record.model_copy(update={"cancel": request}), version)
                break
            except VersionConflict:
                continue
        if not record.supervised:
            await Supervisor(self._backend, self._store, actor=actor).drive(job)


class Observer:
    """Reads status: the record joined with the scheduler's live view, through the same decision."""

    def __init__(self, backend: Backend, store: RecordStore) -> None:
        self._backend = backend
        self._store = store

    async def get(self, job: str) -> Status:
        record, _ = await self._store.get(job)
        return status(record, await self._backend.list(job))

    async def watch(self, job: str, *, poll_interval: float = 5.0) -> AsyncIterator[Status]:
        """Yield the status now and each time it changes, until the job is settled."""
        wake = asyncio.Event()
        unsubscribe = (self._backend.subscribe(job, wake.set), self._store.subscribe(job, wake.set))
        last: Status | None = None
        try:
            while True:
                wake.clear()
                record, _ = await self._store.get(job)
                objects = await self._backend.list(job)
                current = status(record, objects, decide(record, objects))
                if current != last:
                    last = current
                    yield current
                if current.settled:
                    return
                try:
                    async with asyncio.timeout(poll_interval):
                        await wake.wait()
                except TimeoutError:
                    pass
        finally:
            for unsub in unsubscribe:
                unsub()


class Cluster:
    """A backend composed with dispatch's core and a record store."""

    def __init__(self, backend: Backend, store: RecordStore) -> None:
        self.backend = backend
        self.store = store
        self.operator = Operator(backend, store)
        self.observer = Observer(backend, store)

    def supervisor(self, **options: object) -> Supervisor:
        """A supervisor over this cluster's backend and store."""
        return Supervisor(self.backend, self.store, **options)  # type: ignore[arg-type]

    async def aclose(self) -> None:
        await self.backend.aclose()


def compose(backend: Backend, *, store: RecordStore | None = None) -> Cluster:
    """Compose a backend you built with the core. The store defaults to a :class:`MemoryStore`."""
    return Cluster(backend, store if store is not None else MemoryStore())


async def open(
    name: str, config: Mapping[str, object] | None = None, *, store: RecordStore | None = None
) -> Cluster:
    """Find the adapter registered as ``name`` in the ``dispatch.adapters`` entry points and compose it."""
    found = {ep.name: ep for ep in entry_points(group=ADAPTER_GROUP)}
    if name not in found:
        raise AdapterNotFound(name, sorted(found))
    factory = found[name].load()
    backend = factory(config)
    if inspect.isawaitable(backend):
        backend = await backend
    return compose(backend, store=store)

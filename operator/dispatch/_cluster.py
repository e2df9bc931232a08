"""The cluster facade: a backend composed with the core, seen through two roles.

``cluster.operator`` submits and cancels (the tutorial's Operator role: it changes things);
``cluster.observer`` gets and watches (the Observer role: it only reads).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Callable, Mapping

from pydantic import ValidationError

from . import _registry
from ._decide import decide, status
from ._errors import (
    AdapterNotFound,
    ConditionNotMet,
    ConfigError,
    DispatchError,
    InvalidTransition,
    JobNotFound,
    VersionConflict,
)
from ._memstore import MemoryStore
from ._model import (
    Actor,
    CancelRequest,
    JobSpec,
    Phase,
    Plan,
    Record,
    RetryRequest,
    State,
    Status,
    SuspendRequest,
)
from ._plan import make_plan
from ._protocols import Backend, RecordStore
from ._supervisor import Supervisor, utcnow


class Operator:
    """Submits, cancels, suspends, resumes and retries jobs. Every call names the actor that makes it."""

    def __init__(self, backend: Backend, store: RecordStore) -> None:
        self._backend = backend
        self._store = store

    def plan(self, spec: JobSpec, *, supervised: bool = False) -> Plan:
        """The plan :meth:`submit` would make, without recording or creating anything (a dry run).

        Raises :class:`~dispatch.PlanError` when a rule could not be enforced.
        """
        return make_plan(spec.name, spec, self._backend.capabilities, supervised=supervised)

    async def submit(self, spec: JobSpec, actor: Actor, *, supervised: bool = False) -> Plan:
        """Plan the job, record it, and return the plan. Nothing runs yet if ``supervised``.

        ``supervised=True`` says a supervisor will run for this job (``WithSupervisor`` in the
        tutorial), so rules the scheduler cannot enforce can go to it. Without it such a rule makes
        submission fail with :class:`~dispatch.PlanError`, and nothing is recorded or created. An
        unsupervised job is launched here, since no supervisor will launch it; its status shows its
        outcome as soon as the scheduler has one, and :meth:`settle` records it.
        """
        plan = self.plan(spec, supervised=supervised)
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

    async def cancel(self, job: str, actor: Actor) -> bool:
        """Ask for the job to end as ``cancelled``, recording who asked. The record is kept.

        Returns False, changing nothing, when the job already has an outcome or a cancel request
        (status says which); True when this call asked for it.
        """

        def ask(record: Record) -> Record | None:
            if record.state.is_outcome or record.cancel is not None:
                return None
            return record.model_copy(update={"cancel": CancelRequest(actor=actor, time=utcnow())})

        return await self._ask(job, actor, ask)

    async def suspend(self, job: str, actor: Actor) -> bool:
        """Suspend the job, recording who asked: its running submission is stopped (as every stop
        is: the program's grace period, then a kill) and no next one is authorized until
        :meth:`resume`. Returns False, changing nothing, when a suspend is already asked for.
        Raises :class:`~dispatch.InvalidTransition` when the job already has an outcome."""

        def ask(record: Record) -> Record | None:
            if record.state.is_outcome:
                raise InvalidTransition(
                    f"job {job} is {record.state}: only a job without an outcome is suspended"
                )
            if record.suspend_asked:
                return None
            request = SuspendRequest(suspend=True, actor=actor, time=utcnow())
            return record.model_copy(update={"suspend": request})

        return await self._ask(job, actor, ask)

    async def resume(self, job: str, actor: Actor) -> bool:
        """Resume a suspended job, recording who asked: once the suspended submission's objects have
        ended, a new submission is authorized (no rule fires, no budget is spent). Returns False,
        changing nothing, when no suspend is asked for."""

        def ask(record: Record) -> Record | None:
            if not record.suspend_asked:
                return None
            request = SuspendRequest(suspend=False, actor=actor, time=utcnow())
            return record.model_copy(update={"suspend": request})

        return await self._ask(job, actor, ask)

    async def retry(self, job: str, actor: Actor, *, fresh_budget: int | None = None) -> bool:
        """Run a failed job again, recording who asked: once every object it made has ended, the
        job is reopened (``failed`` -> ``pending``) with a new submission under the same record.
        ``fresh_budget`` names a rule whose budget starts afresh (its earlier firings no longer
        count). Returns False, changing nothing, when a retry is already asked for and not yet
        taken. Raises :class:`~dispatch.InvalidTransition` when the job has not failed (a
        succeeded job is done, a cancelled one was ended by a person) or names no such rule.
        A supervised job's supervisor (run again: it returned once the job settled) takes it.
        """

        def ask(record: Record) -> Record | None:
            if record.state is not State.FAILED:
                raise InvalidTransition(f"job {job} is {record.state}: only a failed job is retried")
            if fresh_budget is not None and not 0 <= fresh_budget < len(record.plan.rules):
                raise InvalidTransition(f"fresh_budget: job {job} has no rule {fresh_budget}")
            if record.retry_asked is not None:
                return None
            request = RetryRequest(
                n=record.retries + 1, actor=actor, time=utcnow(), fresh_budget=fresh_budget
            )
            return record.model_copy(update={"retry": request})

        return await self._ask(job, actor, ask)

    async def _ask(self, job: str, actor: Actor, change: Callable[[Record], Record | None]) -> bool:
        """Write what ``change`` makes of the job's record by compare-and-swap (None: nothing to ask);
        an unsupervised job is then driven, since no supervisor will take the request."""
        asked = False
        while True:
            record, version = await self._store.get(job)
            changed = change(record)
            if changed is None:
                break
            try:
                await self._store.put(changed, version)
                asked = True
                break
            except VersionConflict:
                continue
        if not record.supervised:
            await Supervisor(self._backend, self._store, actor=actor).drive(job)
        return asked

    async def settle(self, job: str, actor: Actor) -> Record:
        """Record what the scheduler did with a job no supervisor runs; return the record.

        An unsupervised job (every rule enforced by the scheduler) has no supervisor to write its
        outcome: its status shows the outcome from the scheduler's view at once, and this records
        it (the outcome's actor is the scheduler; ``actor`` performs the other steps) and, once every
        object has ended, settles it. Safe to call any number of times, by anyone, at any moment;
        it takes the steps there are and returns when only the scheduler can move the job on.
        For a supervised job it does nothing: its supervisor records everything.
        """
        record, _ = await self._store.get(job)
        if record.supervised:
            return record
        await Supervisor(self._backend, self._store, actor=actor).drive(job)
        record, _ = await self._store.get(job)
        return record


class Observer:
    """Reads status: the record joined with the scheduler's live view, through the same decision."""

    def __init__(self, backend: Backend, store: RecordStore) -> None:
        self._backend = backend
        self._store = store

    async def get(self, job: str) -> Status:
        record, _ = await self._store.get(job)
        return status(record, await self._backend.list(job))

    async def wait(
        self, job: str, until: Callable[[Status], bool] | None = None, *, poll_interval: float = 5.0
    ) -> Status:
        """Wait until ``job``'s status satisfies ``until`` and return that status.

        Without ``until``, wait until :meth:`watch` ends (the job is settled, or a job no supervisor
        runs shows an outcome with no live object). Every status change is looked at, so a state
        that lasts a moment is not missed. Bound the wait with ``asyncio.timeout``. A job that ends
        without satisfying ``until`` raises :class:`~dispatch.ConditionNotMet` (its status will
        not change again) instead of waiting forever.
        """
        last: Status | None = None
        async for current in self.watch(job, poll_interval=poll_interval):
            last = current
            if until is not None and until(current):
                return current
        if last is None:  # pragma: no cover - watch yields the status at least once
            raise JobNotFound(job)
        if until is None:
            return last
        raise ConditionNotMet(job, last)

    async def watch(self, job: str, *, poll_interval: float = 5.0) -> AsyncIterator[Status]:
        """Yield the status now and each time it changes, until the job is settled.

        A job no supervisor runs is never settled by one: its watch ends once its status shows an
        outcome and every object has ended (see :meth:`Operator.settle`).
        """
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
                if current.settled or (not record.supervised and _finished(current)):
                    return
                try:
                    async with asyncio.timeout(poll_interval):
                        await wake.wait()
                except TimeoutError:
                    pass
        finally:
            for unsub in unsubscribe:
                unsub()


def _finished(current: Status) -> bool:
    """An outcome shown, and every object ended: nothing more will happen to the job."""
    return current.state.is_outcome and all(
        o.phase is Phase.ENDED for sub in current.submissions for o in sub.objects
    )


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
    """Find the adapter registered as ``name`` in the ``dispatch.adapters`` entry points and compose it.

    ``config`` may come from YAML, the environment or a command line: values given as text are
    parsed strictly, and an invalid one raises :class:`~dispatch.ConfigError` naming the key.
    """
    factory = _registry.opener(name)
    if factory is None:
        raise AdapterNotFound(name, _registry.names())
    try:
        backend = factory(config)
        if inspect.isawaitable(backend):
            backend = await backend
    except DispatchError:
        raise
    except ValidationError as error:
        raise _config_error(name, error) from None
    except (ValueError, TypeError) as error:
        raise ConfigError(f"{name} adapter: {error}") from error
    return compose(backend, store=store)


def _config_error(adapter: str, error: ValidationError) -> ConfigError:
    """Pydantic's errors, each prefixed with the key it is about."""
    problems = error.errors()
    parts = []
    for e in problems:
        key = ".".join(str(p) for p in e["loc"])
        parts.append(f"{key}: {e['msg']}" if key else str(e["msg"]))
    first = ".".join(str(p) for p in problems[0]["loc"]) if problems else None
    return ConfigError(f"{adapter} adapter: {'; '.join(parts)}", key=first or None)

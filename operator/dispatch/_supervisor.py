"""The supervisor: read the record, list the job's objects, ask :func:`decide`, do that one step.

It keeps nothing between steps that the record and the scheduler do not hold, so a supervisor that
restarts anywhere goes on from where things really are, and two supervisors on one job are safe:
every write is a compare-and-swap, and the loser re-reads and decides again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from ._decide import (
    WRITES,
    Create,
    Decision,
    Done,
    End,
    Release,
    Step,
    Wait,
    apply,
    decide,
)
from ._errors import ObjectExists, TransientBackendError, VersionConflict
from ._model import SUPERVISOR, Actor, ObjectView, Record
from ._protocols import Backend, RecordStore

log = logging.getLogger("dispatch.supervisor")


def utcnow() -> datetime:
    return datetime.now(UTC)


class Listener(Protocol):
    """Told about every step a supervisor takes (events, metrics). Must not block."""

    def stepped(self, job: str, step: Step, before: Record, after: Record | None) -> None: ...

    def conflicted(self, job: str) -> None: ...

    def errored(self, job: str, step: Step, error: Exception) -> None: ...


@dataclass(frozen=True, slots=True)
class Intent:
    """A decision and what it was based on: perform it, or throw it away and prepare again."""

    record: Record
    version: str
    objects: tuple[ObjectView, ...]
    decision: Decision


class Supervisor:
    """Supervises jobs of one backend and one record store until they settle."""

    def __init__(
        self,
        backend: Backend,
        store: RecordStore,
        *,
        actor: Actor = SUPERVISOR,
        poll_interval: float = 5.0,
        retry_delays: tuple[float, ...] = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0),
        clock: Callable[[], datetime] = utcnow,
        listener: Listener | None = None,
    ) -> None:
        self.backend = backend
        self.store = store
        self.actor = actor
        self.poll_interval = poll_interval
        self.retry_delays = retry_delays
        self.clock = clock
        self.listener = listener

    async def run(self, job: str) -> Record:
        """Supervise ``job`` until its record is settled; return the settled record."""
        wake = asyncio.Event()
        unsubscribe = (self.backend.subscribe(job, wake.set), self.store.subscribe(job, wake.set))
        failures = 0
        try:
            while True:
                wake.clear()  # before reading, so a change after the read wakes the wait below
                try:
                    intent = await self.prepare(job)
                    step = intent.decision.step
                    if isinstance(step, Done):
                        return intent.record
                    if isinstance(step, Wait):
                        failures = 0
                        await _wait(wake, self.poll_interval)
                        continue
                    await self.perform(intent)
                    failures = 0
                except VersionConflict:
                    continue
                except TransientBackendError as error:
                    delay = self.retry_delays[min(failures, len(self.retry_delays) - 1)]
                    failures += 1
                    log.warning("job %s: %s; retrying in %.2fs", job, error, delay, extra={"job": job})
                    await asyncio.sleep(delay)
        finally:
            for unsub in unsubscribe:
                unsub()

    async def run_all(self, jobs: Iterable[str]) -> dict[str, Record]:
        """Supervise many jobs concurrently in this event loop; return their settled records."""
        async with asyncio.TaskGroup() as group:
            tasks = {job: group.create_task(self.run(job)) for job in jobs}
        return {job: task.result() for job, task in tasks.items()}

    async def drive(self, job: str) -> Decision:
        """Take steps until there is nothing to do but wait; return that last decision."""
        while True:
            decision = await self.step(job)
            if isinstance(decision.step, Wait | Done):
                return decision

    async def step(self, job: str) -> Decision:
        """Prepare and perform one step; a lost compare-and-swap is not an error."""
        intent = await self.prepare(job)
        with contextlib.suppress(VersionConflict):
            await self.perform(intent)
        return intent.decision

    async def prepare(self, job: str) -> Intent:
        """Read the record, then list the objects (in that order: see :func:`decide`), then decide."""
        record, version = await self.store.get(job)
        objects = tuple(await self.backend.list(job))
        return Intent(record, version, objects, decide(record, objects))

    async def perform(self, intent: Intent) -> None:
        """Do the intent's step: one write or one backend call. Raises VersionConflict when a write loses."""
        step = intent.decision.step
        record = intent.record
        job = record.job
        after: Record | None = None
        try:
            if isinstance(step, WRITES):
                after = apply(record, step, actor=self.actor, now=self.clock())
                await self.store.put(after, intent.version)
            elif isinstance(step, Create):
                # Another creator may have made it first: it is a candidate like ours would have been.
                with contextlib.suppress(ObjectExists):
                    await self.backend.create(job, step.submission, record.spec, record.plan)
            elif isinstance(step, Release):
                await self.backend.release(step.object_id)
            elif isinstance(step, End):
                await self.backend.end(step.object_id)
            else:
                return
        except VersionConflict:
            if self.listener is not None:
                self.listener.conflicted(job)
            raise
        except Exception as error:
            if self.listener is not None:
                self.listener.errored(job, step, error)
            raise
        _log_step(job, step, intent.decision, record)
        if self.listener is not None:
            self.listener.stepped(job, step, record, after)


async def _wait(wake: asyncio.Event, seconds: float) -> None:
    try:
        async with asyncio.timeout(seconds):
            await wake.wait()
    except TimeoutError:
        pass


def _log_step(job: str, step: Step, decision: Decision, record: Record) -> None:
    if not log.isEnabledFor(logging.INFO):
        return
    submission = getattr(step, "submission", None)
    if submission is None:
        submission = record.current.n if record.current is not None else 0
    log.info(
        "job %s submission %s: %s (cause %s)",
        job,
        submission,
        type(step).__name__,
        decision.cause.kind,
        extra={
            "job": job,
            "submission": submission,
            "step": type(step).__name__,
            "cause": str(decision.cause.kind),
        },
    )

"""The supervisor: read the record, list the job's objects, ask :func:`decide`, do that one step.

It keeps nothing between steps that the record and the scheduler do not hold, so a supervisor that
restarts anywhere goes on from where things really are, and two supervisors on one job are safe:
every write is a compare-and-swap, and the loser re-reads and decides again. A rule's backoff is no
exception: its end time is computed from the record (:func:`~dispatch._decide.decide`), the
supervisor's clock says when it has come (:func:`~dispatch._decide.due`), and the one timer the
work queue keeps for the job only wakes it then (:meth:`WorkQueue.wake_at`).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from ._change import spec_for
from ._decide import (
    WRITES,
    Create,
    Decision,
    Done,
    End,
    RecordSettled,
    Release,
    Step,
    Wait,
    apply,
    decide,
    describe_step,
    due,
    unseen_canonical,
)
from ._errors import ObjectExists, TransientBackendError, VersionConflict
from ._model import SUPERVISOR, Actor, ObjectView, Record
from ._protocols import Backend, Confirming, Quiescing, RecordStore

log = logging.getLogger("dispatch.supervisor")


def utcnow() -> datetime:
    return datetime.now(UTC)


class Listener(Protocol):
    """Told about every step a supervisor takes (events, metrics). Must not block.

    Pass one as ``Supervisor(..., listener=...)``. Each method is called in the event loop, right
    after the step: ``stepped`` once it has landed (``after`` is the record written, None for a
    backend call), ``conflicted`` when a write lost its compare-and-swap (the supervisor re-reads
    and decides again), ``errored`` when the step raised.
    """

    def stepped(self, job: str, step: Step, before: Record, after: Record | None) -> None:
        """``step`` landed; ``before`` is the record it was decided on."""

    def conflicted(self, job: str) -> None:
        """A write lost its compare-and-swap."""

    def errored(self, job: str, step: Step, error: Exception) -> None:
        """``step`` raised ``error`` (retried when it is a TransientBackendError)."""


@dataclass(frozen=True, slots=True)
class Intent:
    """A decision and what it was based on: perform it, or throw it away and prepare again.

    :meth:`Supervisor.prepare` returns one and :meth:`Supervisor.perform` does it; between the two
    the world may change, which is what the compare-and-swap of every write is for.
    """

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
        return (await self.run_all((job,), concurrency=1))[job]

    async def run_all(self, jobs: Iterable[str], *, concurrency: int = 32) -> dict[str, Record]:
        """Supervise many jobs concurrently in this event loop; return their settled records.

        A work queue rather than a task per job: a job that may have something to do (it was
        woken by its backend or its store, it just took a step, or the poll interval passed)
        waits in one queue, and ``concurrency`` workers each take one job and do one step. A job
        is never worked on by two workers at once, and a wake that arrives while it is being
        worked on puts it back in the queue, so no change is missed. Waiting jobs cost no task,
        no frames and no timer, which is what keeps a supervised job small.

        A job whose step raises an error that is not transient (a bug, a vanished record) stops
        being supervised; the first such error is raised once every other job has settled.
        """
        settled: dict[str, Record] = {}

        async def turn(job: str) -> Turn:
            intent = await self.prepare(job)
            step = intent.decision.step
            if isinstance(step, Done):
                settled[job] = intent.record
                return Turn.DONE
            if isinstance(step, Wait):
                queue.wake_at(job, self.seconds_until(step))
                return Turn.WAIT
            await self.perform(intent)
            return Turn.AGAIN

        queue = WorkQueue(turn, jobs, poll_interval=self.poll_interval, retry_delays=self.retry_delays)
        unsubscribe: list[Callable[[], None]] = []
        for job in queue.pending:
            wake = functools.partial(queue.enqueue, job)
            unsubscribe.append(self.backend.subscribe(job, wake))
            unsubscribe.append(self.store.subscribe(job, wake))
        try:
            async with asyncio.TaskGroup() as group:
                for _ in range(max(min(concurrency, len(queue.pending)), 1)):
                    group.create_task(queue.work())
        finally:
            for unsub in unsubscribe:
                unsub()
        if queue.errors:
            raise next(iter(queue.errors.values()))
        return settled

    def seconds_until(self, step: Wait) -> float | None:
        """How long until a timed ``step`` (a backoff) ends by the supervisor's clock; None for a
        wait that ends only when something changes."""
        if step.until is None:
            return None
        return max((step.until - self.clock()).total_seconds(), 0.0)

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
        missing = unseen_canonical(record, objects)
        if missing is not None and isinstance(self.backend, Confirming):
            # Another process may have created it a moment ago and our cache not seen it yet.
            objects = tuple(await self.backend.confirm(job, missing))
        # A backoff whose time has come is its authorization (decide itself reads no clock).
        return Intent(record, version, objects, due(decide(record, objects), self.clock()))

    async def perform(self, intent: Intent) -> None:
        """Do the intent's step: one write or one backend call. Raises VersionConflict when a write loses."""
        step = intent.decision.step
        record = intent.record
        job = record.job
        after: Record | None = None
        try:
            if isinstance(step, RecordSettled) and not await self._still_settles(intent):
                return  # a create landed after the decision's listing: decide again on a new one
            if isinstance(step, WRITES):
                after = apply(record, step, actor=self.actor, now=self.clock())
                await self.write(intent, after)
            elif isinstance(step, Create):
                # Another creator may have made it first: it is a candidate like ours would have been.
                created: str | None = None
                with contextlib.suppress(ObjectExists):
                    # The object is built from the spec its submission runs with: the job's, with
                    # the changes of the rules that authorized the submissions so far.
                    spec = spec_for(record, step.submission)
                    created = await self.backend.create(job, step.submission, spec, record.plan)
                if created is not None:
                    await self._end_if_settled(job, created)
            elif isinstance(step, Release):
                await self.backend.release(step.object_id)
            elif isinstance(step, End):
                await self.backend.end(step.object_id, grace_seconds=step.grace_seconds)
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
        log_step(job, step, intent.decision, record)
        if self.listener is not None:
            self.listener.stepped(job, step, record, after)

    async def write(self, intent: Intent, record: Record) -> None:
        """Write ``record`` (what the intent's step makes of its record) at the intent's version.

        The one record write of :meth:`perform`: a subclass whose store writes more than the record
        passes it what the decision shows (the operator's observed fields)."""
        await self.store.put(record, intent.version)

    async def _still_settles(self, intent: Intent) -> bool:
        """Settle only if a listing taken after the decision to settle decides the same.

        Shrinks the window for a late create (see :meth:`_end_if_settled`) to the settle write. A
        backend with writes in flight that make its objects ended has them land first (Quiescing).
        """
        if isinstance(self.backend, Quiescing):
            await self.backend.quiesce(intent.record.job)
        fresh = await self.backend.list(intent.record.job)
        return isinstance(decide(intent.record, fresh).step, RecordSettled)

    async def _end_if_settled(self, job: str, object_id: str) -> None:
        """A late creator ends what it made when the job settled meanwhile.

        A create cannot be fenced by a record write, so a Create decided before the job settled
        can land after it. The object is held (never released); re-reading the record right after
        the create and ending it is what keeps it from outliving the settled job. Only a creator
        that dies between its create and this end leaves one, held, until the next step anyone
        takes on the job (docs/semantics.md, invariant 5).
        """
        record, _ = await self.store.get(job)
        if record.settled:
            log.info(
                "job %s: ended object %s, created after the job settled",
                job,
                object_id,
                extra={"job": job},
            )
            await self.backend.end(object_id)


class Turn(enum.Enum):
    """What a work queue's handler says about the job it just worked on."""

    DONE = "done"
    """Nothing more to do: the job leaves the queue (settled, refused, gone)."""
    AGAIN = "again"
    """A step landed: look again, behind the jobs already waiting."""
    URGENT = "urgent"
    """A recovery is under way: look again before routine work."""
    WAIT = "wait"
    """Nothing to do until a wake (a watch, the poll interval)."""


Handler = Callable[[str], Awaitable[Turn]]


class WorkQueue:
    """The work queue behind :meth:`Supervisor.run_all` and the operator's supervision loop.

    Jobs may be added and removed while it runs. Two lanes: urgent (a job woken by failure evidence,
    a recovery under way) is always taken before routine (a first look, an observe, a poll); a
    recovery under way (a turn that returned URGENT) goes to the head of the urgent lane. A job
    is never worked on by two workers at once; a wake while it is worked on puts it back once that
    turn is done. ``handle(job)`` does one turn; a lost compare-and-swap is AGAIN; a transient error
    is retried after ``retry_delays``; any other error stops the job (``errors``) unless
    ``persistent``, where it is retried too (a long-running operator never gives a job up).
    With ``forever`` the workers keep waiting for jobs when none is left (until cancelled).
    A queued job wakes one idle worker. Once no job has been queued for ``poll_interval``, the
    periodic look queues every job again for backends that cannot wake it; ``looked()`` narrows it
    to the jobs that need it.
    """

    def __init__(
        self,
        handle: Handler,
        jobs: Iterable[str] = (),
        *,
        poll_interval: float,
        retry_delays: tuple[float, ...],
        forever: bool = False,
        persistent: bool = False,
        looked: Callable[[], Iterable[str]] | None = None,
    ) -> None:
        self.handle = handle
        self.looked = looked
        self.poll_interval = poll_interval
        self.retry_delays = retry_delays
        self.forever = forever
        self.persistent = persistent
        self.pending: dict[str, None] = dict.fromkeys(jobs)  # ordered, unique
        self.lanes: tuple[deque[str], deque[str]] = (deque(), deque(self.pending))
        self.queued: set[str] = set(self.pending)
        self.busy: set[str] = set()
        self.dirty: set[str] = set()
        self.dirty_urgent: set[str] = set()
        self.failures: dict[str, int] = {}
        self.errors: dict[str, Exception] = {}
        self.idle: dict[str, asyncio.Event] = {}
        """Set when a removed job's turn in progress is over (see :meth:`remove`)."""
        self.waiting: deque[asyncio.Future[None]] = deque()
        """One future per idle worker: a queued job wakes one of them, not all (32 idle workers
        each leaving and re-entering their wait for every job were 4 % of a reaction's CPU)."""
        self.timers: dict[str, asyncio.TimerHandle] = {}
        """One timer per job whose backoff runs (:meth:`wake_at`); no other job has one."""
        self.queued_at = 0.0
        """When the last job was queued (``time.monotonic``): a worker that waited ``poll_interval``
        looks only if none was queued meanwhile (the periodic look is for a quiet queue)."""

    def add(self, job: str, *, urgent: bool = False) -> None:
        """Supervise ``job`` (again) from now on; a job already here is only woken."""
        if job not in self.pending:
            self.pending[job] = None
            self.errors.pop(job, None)
        self.enqueue(job, urgent=urgent)

    def wake_at(self, job: str, delay: float | None) -> None:
        """Wake ``job`` (urgently: a recovery is due) once ``delay`` seconds have passed, replacing
        the job's earlier timer; None only cancels it. A timer that fires early by the wall clock
        costs one turn, which finds the wait still running and sets the timer again."""
        old = self.timers.pop(job, None)
        if old is not None:
            old.cancel()
        if delay is None or job not in self.pending:
            return

        def fire() -> None:
            self.timers.pop(job, None)
            self.enqueue(job, urgent=True)

        self.timers[job] = asyncio.get_running_loop().call_later(delay, fire)

    async def remove(self, job: str) -> None:
        """Stop supervising ``job``; returns once no turn of it runs any more."""
        self.wake_at(job, None)
        self.pending.pop(job, None)
        self.failures.pop(job, None)
        self.queued.discard(job)
        self.dirty.discard(job)
        self.dirty_urgent.discard(job)
        if job in self.busy:
            done = self.idle.setdefault(job, asyncio.Event())
            await done.wait()

    def wake_urgent(self, job: str) -> None:
        """:meth:`enqueue` ``job`` urgently: the wake-up a backend calls on a change of its objects
        (a ``partial`` of this holds no keyword dict: about 230 bytes less per supervised job)."""
        self.enqueue(job, urgent=True)

    def enqueue(self, job: str, *, urgent: bool = False, first: bool = False) -> None:
        """Queue ``job`` for a turn; ``first`` (urgent only) puts it at the head of the urgent lane."""
        if job not in self.pending:
            return
        if job in self.busy:
            self.dirty.add(job)  # being worked on: look again when that turn is done
            if urgent:
                self.dirty_urgent.add(job)
        elif job not in self.queued or urgent:
            self.queued.add(job)
            lane = self.lanes[0 if urgent else 1]
            if urgent and first:
                lane.appendleft(job)
            else:
                lane.append(job)  # a routine entry left behind is skipped
            self.queued_at = time.monotonic()  # no running loop needed: add() may come before it
            self._wake(1)

    def recovering(self) -> bool:
        """Whether a job waits in the urgent lane (woken by failure evidence, or a recovery under
        way) for a worker: what the operator holds its Events back for."""
        return any(job in self.queued for job in self.lanes[0])

    def finish(self, job: str) -> None:
        self.wake_at(job, None)
        self.pending.pop(job, None)
        self.failures.pop(job, None)
        if not self.pending:
            self._wake(len(self.waiting))  # let idle workers see there is nothing left

    def _wake(self, workers: int) -> None:
        """Wake up to ``workers`` idle workers."""
        while workers > 0 and self.waiting:
            waiter = self.waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                workers -= 1

    def _next(self) -> str | None:
        for lane in self.lanes:
            while lane:
                job = lane.popleft()
                if job in self.queued and job not in self.busy:
                    return job
        return None

    async def work(self) -> None:
        loop = asyncio.get_running_loop()
        while self.pending or self.forever:
            job = self._next()
            if job is None:
                waiter: asyncio.Future[None] = loop.create_future()
                self.waiting.append(waiter)
                since = time.monotonic()
                try:
                    async with asyncio.timeout(self.poll_interval):
                        await waiter
                except TimeoutError:
                    if self.queued_at <= since:
                        # Nothing queued for poll_interval: a periodic look, for backends that
                        # cannot wake us.
                        for job in list(self.pending if self.looked is None else self.looked()):
                            self.enqueue(job)
                finally:
                    waiter.cancel()  # a time-out has cancelled it already; a wake has popped it
                    with contextlib.suppress(ValueError):
                        self.waiting.remove(waiter)
                continue
            self.queued.discard(job)
            self.busy.add(job)
            turn = Turn.WAIT
            try:
                turn = await self.handle(job)
                if turn is Turn.DONE:
                    self.finish(job)
                self.failures.pop(job, None)
            except VersionConflict:
                turn = Turn.AGAIN
            except Exception as error:
                if not isinstance(error, TransientBackendError) and not self.persistent:
                    log.exception("job %s: supervision stopped", job, extra={"job": job})
                    self.errors[job] = error
                    self.finish(job)
                else:
                    failures = self.failures.get(job, 0)
                    self.failures[job] = failures + 1
                    delay = self.retry_delays[min(failures, len(self.retry_delays) - 1)]
                    log.warning("job %s: %s; retrying in %.2fs", job, error, delay, extra={"job": job})
                    loop.call_later(delay, self.enqueue, job)
            finally:
                self.busy.discard(job)
                idle = self.idle.pop(job, None)
                if idle is not None:
                    idle.set()
                urgent = turn is Turn.URGENT or job in self.dirty_urgent
                if turn in (Turn.AGAIN, Turn.URGENT) or job in self.dirty:
                    self.dirty.discard(job)
                    self.dirty_urgent.discard(job)
                    # A recovery under way goes on before recoveries not yet begun: after a mass
                    # preemption each job is released within its own few steps, instead of every
                    # job waiting for every other job's next step (round-robin released none
                    # until the last lap).
                    self.enqueue(job, urgent=urgent, first=turn is Turn.URGENT)
            # A backend whose calls never suspend (the memory backend) would otherwise keep this
            # worker, and so the event loop, busy until every job waits: one step, then yield.
            await asyncio.sleep(0)


def log_step(job: str, step: Step, decision: Decision, record: Record) -> None:
    """The INFO line (and its JSON fields) of one step taken, ``record`` the one it was decided on."""
    if not log.isEnabledFor(logging.INFO):
        return
    submission = getattr(step, "submission", None)
    if submission is None:
        submission = record.current.n if record.current is not None else 0
    words = describe_step(step)
    log.info(
        "job %s submission %s: %s (cause %s)",
        job,
        submission,
        words,
        decision.cause.kind,
        extra={
            "job": job,
            "submission": submission,
            "step": words,
            "cause": str(decision.cause.kind),
        },
    )

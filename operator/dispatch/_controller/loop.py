"""The operator's one supervision loop: every DispatchJob in one work queue, no task per job.

The record store's shared DispatchJob watch (list, then watch from its resourceVersion, with
bookmarks: :meth:`KubeRecordStore.watch_all`) discovers every job and keeps a projection of it
(:class:`~dispatch._controller.store.JobView`: the few fields a turn needs and its record's part,
packed, parsed when a turn needs it); each event wakes the job in one
:class:`~dispatch._supervisor.WorkQueue` whose workers take one turn at a time: plan a new job
(or refuse it), else the (Observing)Supervisor's prepare, then perform its one step. The
backends' shared watches wake a job too, in the queue's urgent lane: a change of a job's objects
is where failure evidence comes from, and a recovery under way (authorize, create, record the
canonical, release) stays urgent until it waits, its writes marked urgent for the write limit
(:func:`dispatch._kubeclient.urgent`). Observe writes and first looks are routine. Once the queue
has been quiet for ``poll_interval``, the periodic look queues the jobs whose backend cannot wake
them on every change (the Slurm adapter polls); the workload kit wakes its jobs itself
(:class:`~dispatch._protocols.SelfWaking`), so an idle operator of kit jobs takes no turn at all.
A job whose rule's backoff runs has one timer in the queue (:meth:`WorkQueue.wake_at`), set from
the wait's end time in the record, which wakes it urgently when its next submission is due.
A settled job leaves the queue, unless it has a time to live (``spec.ttlSecondsAfterSettled``,
else the operator's ``--settled-ttl-seconds``): then it waits on one timer for it and is deleted
once it has passed, its final record exported first (:meth:`SupervisionLoop._expire`). A backend
that sees every job's objects at once
(:class:`~dispatch._protocols.Overseeing`) brings it back for one turn when an object of it
changes, and that turn (the first after a start too) ends what a creator that died left held.

Nothing is read before :meth:`SupervisionLoop.start`, which the operator calls once it holds the
Lease; :meth:`stop` cancels the workers and the watch.

The deletion finalizer (``dispatch.dev/finalizer``) is the loop's too, so kopf watches nothing:
kopf keeps every DispatchJob it watches, about 130 KiB each (bench/kopf_cost.py measures it).
A job's first turn adds the finalizer (the store's merge patch carrying the resourceVersion read:
:meth:`KubeRecordStore.set_finalizers`). A turn that finds ``deletionTimestamp`` hands the job to
one deletion task: it takes the job out of the queue (:meth:`forget`: no turn of it runs after
that, so no create lands after the listing), ends every object of the job until none is left,
then removes the finalizer the same way. A standby
runs no loop, so it never lets go of a DispatchJob.

After a start, once the first list has been taken and every job in it has had one turn (planned,
refused, decided to wait or settled), the loop logs ``all N jobs known and decided in S s`` and sets
the gauges ``dispatch_startup_jobs`` and ``dispatch_startup_decided_seconds`` (:meth:`Metrics.decided`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Final

from .._constants import FINALIZER, REASON_BACKEND_NOT_CONFIGURED
from .._decide import (
    Authorize,
    Create,
    Done,
    End,
    RecordCanonical,
    RecordEnd,
    RecordStop,
    Release,
    Wait,
    decide,
    reopening,
)
from .._dispatchjob import expired_note, expires_at, final_summary, settled_time
from .._errors import JobNotFound, VersionConflict
from .._kubeclient import Body, urgent
from .._model import Phase, State
from .._protocols import Backend, Overseeing, SelfWaking
from .._supervisor import Intent, Turn, WorkQueue
from .observed import ObservingSupervisor
from .ports import Supervising

if TYPE_CHECKING:  # an annotation only: the loop reads the views the store hands it
    from .store import JobView

log = logging.getLogger("dispatch.operator")

RECOVERY_STEPS: Final = (RecordEnd, RecordStop, Authorize, Create, RecordCanonical, Release)
"""Steps of a recovery (a new submission on its way): urgent, for the queue and the write limit."""
RETRY_DELAYS: Final = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
DEFAULT_WORKERS: Final = 64
"""Turns at once. A recovery is five writes in a row; when a thousand jobs are preempted at once they
queue for the workers. Fewer leave recoveries waiting for a turn; more raise the API server's
latency for every write, which lengthens the tail after a mass preemption as much: 64 gives the
shortest tail at 10,000 jobs on the test cluster, and stays under the request pool's 100
connections."""
END_POLL: Final = 0.5
STARTUP_GC_PAUSE: Final = 300.0
"""The longest the cyclic collector stays paused after a start (:class:`StartupCollector`)."""


def _duration(span: timedelta) -> str:
    seconds = int(span.total_seconds())
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m{rest % 60:02d}s" if hours else f"{rest // 60}m{rest % 60:02d}s"


class StartupCollector:
    """The cyclic garbage collector paused while a start's first lists are taken and decided.

    A restart decodes every DispatchJob, object and pod into small dicts and lists that all stay
    alive (the store keeps each body until the job's first turn, the kit its projections), and
    the collector, run by allocation counts, traverses that growing heap again and again: the more
    jobs, the more each one's decoding costs, nearly three times as much at 10,000 jobs as with the
    collector paused. Decoded JSON holds no reference cycles, so pausing frees nothing later than
    it would be. :meth:`resume` (every listed job decided, the loop stopped, or
    ``STARTUP_GC_PAUSE`` at most) runs one collection and freezes what survives it (the caches,
    the modules: :func:`gc.freeze`), so that later collections do not traverse them either; they
    are still freed by reference counting when replaced. A collector someone else disabled is
    left as it was.
    """

    def __init__(self, longest: float = STARTUP_GC_PAUSE) -> None:
        self.longest = longest
        self.paused = False
        self._timer: asyncio.TimerHandle | None = None

    def pause(self) -> None:
        if self.paused or not gc.isenabled():
            return
        gc.disable()
        self.paused = True
        self._timer = asyncio.get_running_loop().call_later(self.longest, self.resume)

    def resume(self) -> None:
        if not self.paused:
            return
        self.paused = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        gc.collect()
        gc.freeze()
        gc.enable()


class SupervisionLoop:
    """Every job of ``runtime`` in one work queue; see the module docstring."""

    def __init__(
        self,
        runtime: Supervising,
        *,
        workers: int = DEFAULT_WORKERS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.runtime = runtime
        self.workers = workers
        self._clock = clock
        self.queue = WorkQueue(
            self.turn,
            poll_interval=runtime.poll_interval,
            retry_delays=RETRY_DELAYS,
            forever=True,
            persistent=True,
            looked=lambda: self._looked,
        )
        self.supervisors: dict[str, ObservingSupervisor] = {
            name: ObservingSupervisor(
                backend, runtime.store, listener=runtime.listener, poll_interval=runtime.poll_interval
            )
            for name, backend in runtime.backends.items()
        }
        self._unsubscribe: dict[str, Callable[[], None]] = {}
        self._unsubscribe_others: list[Callable[[], None]] = []
        self._looked: set[str] = set()
        """The supervised jobs whose backend cannot wake them on every change (not
        :class:`~dispatch._protocols.SelfWaking`): the only ones the queue's periodic look takes.
        A look at every job would cost a turn per job every ``poll_interval`` of quiet."""
        self._wakes_itself: dict[Backend, bool] = {
            backend: isinstance(backend, SelfWaking) and backend.wakes_itself
            for backend in runtime.backends.values()
        }
        """Asked once per backend: a runtime-checkable isinstance per job is a measurable part of a
        restart."""
        self._overseers: dict[str, Overseeing] = {
            name: backend for name, backend in runtime.backends.items() if isinstance(backend, Overseeing)
        }
        """The backends that tell of jobs no turn subscribed to, and list from a cache (asked once)."""
        self._tasks: list[asyncio.Task[None]] = []
        self._started = 0.0
        self._undecided: set[str] | None = None
        """The first list's jobs still waiting for their first turn; None until it is taken."""
        self._listed: set[str] = set()
        self._turned: set[str] = set()
        """Jobs that had a turn before the first list was whole (the kit's watches may be synced
        first): decided already, not to be waited for (their next turn may be a poll away)."""
        self._known = 0
        self._deleting: dict[str, asyncio.Task[None]] = {}
        self._forgotten: set[str] = set()
        """Jobs the finalizer took out: their last events (finalizers let go) must not bring them back."""
        self.decided_after: float | None = None
        self.collector = StartupCollector()

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start the watch and the workers (call once this process may supervise)."""
        if self._tasks:
            return
        self._started = self._clock()
        self.collector.pause()
        for backend in self.runtime.backends.values():
            use_owner = getattr(backend, "use_owner", None)
            if use_owner is not None:  # the kit: its objects' ownerReference from the store, no GET each
                use_owner(self.runtime.store.owner_reference)
        self._unsubscribe_others = [o.subscribe_others(self._other) for o in self._overseers.values()]
        if self.runtime.events is not None:  # recoveries before Events, with or without a write limit
            self.runtime.events.hold_while(self.queue.recovering)
        for supervisor in self.supervisors.values():  # and before a note's own write
            supervisor.defer_note = self._defer_note
        self.runtime.store.watch_all(self._on_event, self._on_synced)
        self._tasks = [
            asyncio.create_task(self.queue.work(), name=f"dispatch-worker-{i}") for i in range(self.workers)
        ]

    async def stop(self) -> None:
        self.collector.resume()
        tasks = [*self._tasks, *self._deleting.values()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        self._deleting.clear()
        for unsubscribe in [*self._unsubscribe.values(), *self._unsubscribe_others]:
            unsubscribe()
        self._unsubscribe.clear()
        self._unsubscribe_others = []
        self._looked.clear()
        if self.runtime.events is not None:
            self.runtime.events.hold_while(None)  # no recovery waits for this loop any more
        for supervisor in self.supervisors.values():
            supervisor.defer_note = None

    def _defer_note(self, job: str) -> bool:
        """While recoveries wait for a worker, a note-only write waits too: ``job`` goes back to the
        routine lane, which no worker takes before the urgent lane is empty."""
        if not self.queue.recovering():
            return False
        self.queue.enqueue(job)  # in its turn now: queued (routine) once this turn is done
        return True

    def abandon(self) -> None:
        """Cancel the workers at once (the Lease was lost; the process stops)."""
        self.collector.resume()
        for task in [*self._tasks, *self._deleting.values()]:
            task.cancel()

    async def forget(self, job: str) -> None:
        """Supervise ``job`` no more; returns once no turn of it runs (the finalizer's first step)."""
        self._forgotten.add(job)
        await self.queue.remove(job)
        self._let_go(job)
        self._decided(job)

    def _subscribe(self, job: str, backend: Backend) -> None:
        """Wake ``job`` urgently on every change of its objects; a backend that cannot promise that
        gets the job looked at periodically too."""
        self._unsubscribe[job] = backend.subscribe(job, functools.partial(self.queue.wake_urgent, job))
        if not self._wakes_itself.get(backend, False):
            self._looked.add(job)

    def _let_go(self, job: str) -> None:
        self._looked.discard(job)
        unsubscribe = self._unsubscribe.pop(job, None)
        if unsubscribe is not None:
            unsubscribe()

    def _other(self, job: str) -> None:
        """A backend saw a change of the objects of a job no turn subscribed to: a settled job (or one
        refused) has an object again, as when a creator died between a create that landed after the
        job settled and the end of what it made. One turn looks, if the job is one the watch shows."""
        if job in self._forgotten or not self.runtime.store.knows(job):
            return
        if job in self.queue.pending and job not in self.queue.timers:
            return  # a job whose time to live runs waits on its timer: it is woken now as well
        self.queue.add(job)

    # ------------------------------------------------------------------ discovery

    def _on_event(self, job: str, body: Body | None) -> None:
        if body is None:  # deleted
            self._forgotten.discard(job)
            self.queue.pending.pop(job, None)  # a turn in progress finds it gone (JobNotFound)
            self._let_go(job)
            self._decided(job)
            return
        if job in self._forgotten:
            return
        if self._undecided is None:
            self._listed.add(job)
        if self.runtime.events is not None and not (body.get("status") or {}).get("settled"):
            # A settled job's Events are few (an expiry): the recorder reads its uid then.
            uid = (body.get("metadata") or {}).get("uid")
            if uid:
                with contextlib.suppress(Exception):
                    self.runtime.events.remember(job, str(uid))
        self.queue.add(job)

    def _on_synced(self) -> None:
        self._known = len(self._listed)
        self._undecided = {j for j in self._listed if j in self.queue.pending and j not in self._turned}
        self._listed = set()
        self._turned = set()
        self._check_decided()

    def _decided(self, job: str) -> None:
        if self._undecided is None:
            self._turned.add(job)
        elif self._undecided:
            self._undecided.discard(job)
            self._check_decided()

    def _check_decided(self) -> None:
        if self._undecided or self.decided_after is not None or self._undecided is None:
            return
        self.decided_after = self._clock() - self._started
        self.collector.resume()
        count = self._known
        log.info(
            "all %d jobs known and decided in %.2fs",
            count,
            self.decided_after,
            extra={"decided_jobs": count, "decided_seconds": round(self.decided_after, 3)},
        )
        metrics = self.runtime.metrics
        if metrics is not None:
            with contextlib.suppress(Exception):
                metrics.decided(count, self.decided_after)

    # ------------------------------------------------------------------ one turn

    async def turn(self, job: str) -> Turn:
        try:
            turn = await self._turn(job)
        except JobNotFound:
            turn = Turn.DONE  # deleted
        if turn is Turn.DONE:
            self._let_go(job)
        self._decided(job)
        return turn

    async def _turn(self, job: str) -> Turn:
        runtime = self.runtime
        store = runtime.store
        view = await store.view(job)
        version = view.version
        if view.deleting:
            if FINALIZER in view.finalizers and job not in self._deleting:
                deleting = asyncio.create_task(self._delete(job, view.backend), name=f"dispatch-delete-{job}")
                self._deleting[job] = deleting
            return Turn.DONE
        if FINALIZER not in view.finalizers:
            await store.set_finalizers(job, [*view.finalizers, FINALIZER], version)
            # A job being set up is finished first, like a recovery under way (the head of the
            # urgent lane): 10,000 new jobs each reach their first release in a few steps, instead
            # of every job's finalizer, then every job's plan, before the first create.
            return Turn.URGENT
        name = view.backend
        backend: Backend | None = runtime.backends.get(name)
        if not view.recorded:
            if view.refusal in runtime.final_refusals:
                return Turn.DONE  # stands for this generation; a new one is a new event
            if backend is None:
                if view.refusal != REASON_BACKEND_NOT_CONFIGURED:
                    message = (
                        f"backend {name!r} is not served by this operator; nothing was created, and "
                        f"the job starts once an operator that serves it runs"
                    )
                    await runtime.refuse(job, REASON_BACKEND_NOT_CONFIGURED, message, version)
                    if runtime.events is not None:
                        runtime.events.waiting(job, REASON_BACKEND_NOT_CONFIGURED, message)
                log.warning("job %s: no adapter for backend %r; waiting", job, name, extra={"job": job})
                return Turn.DONE  # a change of the object, or an operator with the adapter, looks again
            assert view.body is not None  # a view without a record keeps its body (for planning)
            authorized = await runtime.initialize(job, view.body, backend, version)
            # Planned (with submission 1 authorized: its create comes next, urgently) or refused:
            # the next turn starts from what was written.
            return Turn.URGENT if authorized else Turn.AGAIN
        if backend is None:
            raise RuntimeError(f"job {job} has a record but this operator has no adapter for its backend")
        if view.settled_at is not None:  # and no retry of a person's reopens it
            if runtime.metrics is not None:
                with contextlib.suppress(Exception):
                    runtime.metrics.observe_state(job, State(view.state))
            return await self._settled(job, view, name)
        record = store.record(job, view)  # parsed here; prepare's get() finds it parsed
        if runtime.metrics is not None:
            with contextlib.suppress(Exception):
                runtime.metrics.observe(record)
        if job not in self._unsubscribe:
            self._subscribe(job, backend)
        supervisor = self.supervisors[name]
        with urgent(False):
            intent = await supervisor.prepare(job)
        if runtime.metrics is not None:
            with contextlib.suppress(Exception):
                runtime.metrics.costs(name, intent.record, intent.objects)
        step = intent.decision.step
        if isinstance(step, Done):
            log.info("job %s settled: %s", job, intent.record.state, extra={"job": job})
            return Turn.DONE
        if isinstance(step, Wait):
            # A backoff: its end is computed from the record, so a restarted operator sets the
            # same timer again on the job's first turn.
            self.queue.wake_at(job, supervisor.seconds_until(step))
            return Turn.WAIT
        recovering = isinstance(step, RECOVERY_STEPS)
        with urgent(recovering):
            await supervisor.perform(intent)
        return Turn.URGENT if recovering else Turn.AGAIN

    async def _settled(self, job: str, view: JobView, name: str) -> Turn:
        """A settled job's turn, decided from its view (no record parsed): delete it once its time
        to live has passed (:meth:`_expire`), else end an object it still has (:meth:`_oversee`)
        and, while its time to live runs, wait for it on one timer (set again from the view by every
        turn, so a restart loses none)."""
        assert view.settled_at is not None
        ttl = view.ttl if view.ttl is not None else self.runtime.settled_ttl
        if ttl is None:
            return await self._oversee(job, name)
        expiry = view.settled_at + timedelta(seconds=ttl)
        now = self.runtime.store.clock()
        if expiry <= now:
            return await self._expire(job, now)
        turn = await self._oversee(job, name)
        if turn is not Turn.DONE:
            return turn
        self._let_go(job)  # settled: no wake of its objects' but an overseer's (:meth:`_other`)
        self.queue.wake_at(job, (expiry - now).total_seconds())
        return Turn.WAIT

    async def _expire(self, job: str, now: datetime) -> Turn:
        """Export the final record (an Event with its summary, a JSON log line a log pipeline keeps),
        then delete the job at the version it was read at: a job changed since (a retry, a longer
        time to live) is a VersionConflict, and its next turn decides again. The finalizer then ends
        whatever it still has, as for any deletion."""
        store = self.runtime.store
        record, version = await store.get(job)  # read whole: the view keeps no record
        ttl = record.spec.ttl_seconds_after_settled
        expiry = expires_at(record, self.runtime.settled_ttl if ttl is None else ttl)
        if reopening(record) or expiry is None or expiry > now:
            return Turn.AGAIN  # changed since the view: decided again from what was read
        summary = final_summary(record)
        log.info(
            "job %s expired: %s %s after it settled; deleting it",
            job,
            record.state,
            _duration(now - (settled_time(record) or now)),
            extra={"job": job, "final_record": summary},
        )
        if self.runtime.events is not None:
            self.runtime.events.expired(job, expired_note(summary))
        await store.delete(job, version)
        # Still supervised: the watch's word of the deletion (maybe already come, while this turn
        # ran) takes the job to the finalizer (a turn that returned DONE would drop that wake).
        return Turn.WAIT

    async def _oversee(self, job: str, name: str) -> Turn:
        """End an object a settled job still has (invariant 5's exception: its creator died before
        it could end it), where listing costs no request (:class:`~dispatch._protocols.Overseeing`):
        at a start, and when the backend shows it (:meth:`_other`). A listing that fails is not
        retried: the backend's next word on the job, or the next start, looks again. Only a job
        that has such an object has its record read (then its objects listed again: the record
        first, as :func:`~dispatch._decide.decide` needs)."""
        if name not in self._overseers:
            return Turn.DONE
        # Listed past the metrics' wrapper: a settled job's ended objects are no failure to time.
        lister = self.runtime.lister(name)
        try:
            if not any(o.phase is not Phase.ENDED or o.retained for o in await lister.list(job)):
                return Turn.DONE
            record, version = await self.runtime.store.get(job)
            if not record.settled or reopening(record):
                return Turn.AGAIN  # changed since the view
            objects = tuple(await lister.list(job))
        except asyncio.CancelledError:
            raise
        except Exception as error:
            log.info("job %s is settled; its objects could not be listed: %s", job, error, extra={"job": job})
            return Turn.DONE
        decision = decide(record, objects)
        if not isinstance(decision.step, End):
            return Turn.DONE
        await self.supervisors[name].perform(Intent(record, version, objects, decision))
        return Turn.AGAIN

    # ------------------------------------------------------------------ the finalizer

    async def _delete(self, job: str, backend_name: str) -> None:
        """End every object of the deleted ``job``, then let go of it (remove the finalizer)."""
        runtime = self.runtime
        try:
            await self.forget(job)  # returns once no turn of the job runs: no create lands after
            backend: Backend | None = runtime.backends.get(backend_name)
            failures = 0
            while True:
                try:
                    if backend is not None:  # None: refused for want of an adapter, nothing created
                        await self._end_objects(job, backend)
                    current = await runtime.store.read(job)
                    finalizers = list(current["metadata"].get("finalizers") or ())
                    if FINALIZER in finalizers:
                        finalizers.remove(FINALIZER)
                        await runtime.store.set_finalizers(
                            job, finalizers, str(current["metadata"]["resourceVersion"])
                        )
                    break
                except JobNotFound:
                    break
                except VersionConflict:
                    continue
                except asyncio.CancelledError:
                    raise
                except Exception as error:
                    delay = RETRY_DELAYS[min(failures, len(RETRY_DELAYS) - 1)]
                    failures += 1
                    log.warning("job %s: deleting: %s; again in %.1fs", job, error, delay, extra={"job": job})
                    await asyncio.sleep(delay)
            runtime.forget_keepers(job)
            log.info("job %s deleted: every object has ended", job, extra={"job": job})
        finally:
            self._deleting.pop(job, None)

    async def _end_objects(self, job: str, backend: Backend) -> None:
        """End every object of ``job`` and wait until they have all ended.

        Ended objects are ended too: that deletes them and lets go of dispatch's finalizer on each,
        which would otherwise hold them once the garbage collector deletes them with the job."""
        first = True
        while True:
            objects = await backend.list(job)
            live = [o for o in objects if o.phase is not Phase.ENDED or o.retained or first]
            first = False
            if not live:
                return
            for o in live:
                await backend.end(o.id)
            await asyncio.sleep(END_POLL)

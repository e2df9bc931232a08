"""kopf handlers: one daemon per DispatchJob runs the core's Supervisor; a finalizer ends its objects.

Why a daemon: daemons are kopf's low-level machinery, spawned on first sight of an object and not
subject to the consistency wait kopf's change handlers do after the operator's own writes. The
supervisor inside it is woken by the adapter's own watch (PyTorchJobs, pods) and by the record
store's one shared watch on DispatchJobs, so the path from a failure on the API server to the next
record write never waits for kopf.

Every handler returns None, so kopf writes nothing into ``.status``; the record is written only by
:class:`~dispatch._kube.store.KubeRecordStore` (PUT of /status carrying the resourceVersion read).

Leadership (``--leader-elect``): every replica runs kopf, so every replica serves the admission
webhooks, but only the Lease holder supervises. ``Runtime.leading`` is an :class:`asyncio.Event` the
elector sets once this process holds the Lease; the daemons wait for it before they read or write
anything, and the deletion handler waits for it before it ends objects (which is what lets kopf
remove the finalizer). A standby's deletion handler returns only once the job is gone or no longer
carries the finalizer (the leader finished), so a standby never releases a DispatchJob itself.
What kopf writes in a standby is idempotent: the finalizer (a JSON patch guarded by the
resourceVersion, the same value in every replica) and the diff-base annotation (the same essence in
every replica, so a second write is a no-op); progress annotations are only written for handlers
that finished or failed, which a waiting handler never does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import kopf

from .._api import SpecError, has_record, job_spec, new_record, record_from, refusal
from .._constants import (
    FINALIZER,
    GROUP,
    PLURAL,
    REASON_BACKEND_NOT_CONFIGURED,
    REASON_INVALID_SPEC,
    REASON_UNENFORCEABLE,
    REASON_UNQUEUEABLE,
    VERSION,
)
from .._errors import JobNotFound, PlanError, VersionConflict
from .._kubeclient import job_id
from .._model import Phase
from .._plan import make_plan
from .._protocols import Backend
from .._supervisor import Listener
from .observed import ObservingSupervisor
from .store import KubeRecordStore

log = logging.getLogger("dispatch.operator")

FINAL_REFUSALS: Final = frozenset({REASON_UNENFORCEABLE, REASON_INVALID_SPEC, REASON_UNQUEUEABLE})
"""Refusals that stand for the object's generation. A missing backend does not: another replica
(or this one, restarted with the adapter configured) may supervise the job. A queue refused because
Kueue is not installed does: the spec is fixed, so the job is created again once Kueue is there."""
RETRY_DELAYS: Final = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
END_POLL: Final = 0.5
END_WAIT: Final = 30.0
GONE_POLL: Final = 2.0
"""How often a standby's deletion handler checks whether the leader has finished the deletion."""


@dataclass
class Runtime:
    """What the handlers share: the store, a backend per ``spec.backend``, the listener, options."""

    store: KubeRecordStore
    backends: Mapping[str, Backend]
    listener: Listener | None = None
    poll_interval: float = 5.0
    events: Any = None
    """An EventRecorder (dispatch._kube.events) or None."""
    metrics: Any = None
    """A Metrics (dispatch._kube.metrics) or None: told each record read and each job deleted."""
    leading: asyncio.Event | None = None
    """Set while this process may supervise (holds the Lease); None: always (no leader election)."""
    tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)

    @property
    def is_leading(self) -> bool:
        return self.leading is None or self.leading.is_set()

    async def until_leading(self, stopped: Any = None) -> bool:
        """Wait until this process leads; False when ``stopped`` (a kopf DaemonStopped) fires first."""
        if self.leading is None or self.leading.is_set():
            return True
        waits: set[asyncio.Future[Any]] = {asyncio.ensure_future(self.leading.wait())}
        if stopped is not None:
            waits.add(asyncio.ensure_future(_stopped(stopped)))
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
            for w in waits:
                with contextlib.suppress(asyncio.CancelledError):
                    await w
        return self.leading.is_set()

    async def until_leading_or_released(self, job: str) -> bool:
        """Wait until this process leads (True), or until the job is gone or no longer carries the
        finalizer, i.e. the leader finished its deletion (False)."""
        while not self.is_leading:
            assert self.leading is not None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.leading.wait(), GONE_POLL)
                return True
            try:
                body = await self.store.read(job)
            except JobNotFound:
                return False
            except asyncio.CancelledError:
                raise
            except Exception as error:  # the API server is unreachable: keep waiting
                log.debug("job %s: cannot read it while waiting for the Lease: %s", job, error)
                continue
            if FINALIZER not in ((body.get("metadata") or {}).get("finalizers") or ()):
                return False
        return True

    def abandon(self) -> None:
        """Cancel every supervisor of this process (the Lease was lost)."""
        for task in list(self.tasks.values()):
            task.cancel()

    def backend_of(self, body: Mapping[str, Any]) -> Backend | None:
        return self.backends.get(str((body.get("spec") or {}).get("backend", "")))

    async def supervise(self, job: str, stopped: Any) -> None:
        """Run the job's supervision until it settles or the daemon is told to stop.

        With leader election, nothing is read or written before this process holds the Lease.
        """
        if not await self.until_leading(stopped):
            return
        task = asyncio.create_task(self._supervise(job), name=f"dispatch-supervise-{job}")
        self.tasks[job] = task
        stop = asyncio.create_task(_stopped(stopped), name=f"dispatch-stopped-{job}")
        try:
            await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (task, stop):
                t.cancel()
            for t in (task, stop):
                with contextlib.suppress(asyncio.CancelledError):
                    await t
            if self.tasks.get(job) is task:
                del self.tasks[job]

    async def stop(self, job: str) -> None:
        """Stop the job's supervisor (if it runs here) and wait until it has stopped."""
        task = self.tasks.get(job)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _supervise(self, job: str) -> None:
        failures = 0
        while True:
            try:
                if await self._run_once(job):
                    return
                failures = 0
            except JobNotFound:
                return  # deleted
            except asyncio.CancelledError:
                raise
            except Exception as error:
                delay = RETRY_DELAYS[min(failures, len(RETRY_DELAYS) - 1)]
                failures += 1
                log.warning("job %s: %s; supervising again in %.1fs", job, error, delay, extra={"job": job})
                await asyncio.sleep(delay)

    async def _run_once(self, job: str) -> bool:
        """True when there is nothing more to do for this job (settled or refused)."""
        body = await self.store.read(job)
        version = str(body["metadata"]["resourceVersion"])
        backend = self.backend_of(body)
        if not has_record(body):
            if refusal(body) in FINAL_REFUSALS:
                return True
            if backend is None:
                name = (body.get("spec") or {}).get("backend")
                if refusal(body) != REASON_BACKEND_NOT_CONFIGURED:
                    message = f"this operator has no adapter for backend {name!r}; nothing was created"
                    await self._refuse(job, REASON_BACKEND_NOT_CONFIGURED, message, version)
                log.warning("job %s: no adapter for backend %r; waiting", job, name, extra={"job": job})
                await asyncio.sleep(max(self.poll_interval, 30.0))
                return False
            if not await self._initialize(job, body, backend, version):
                return False  # lost a race, or refused: read again
        if backend is None:
            raise RuntimeError(f"job {job} has a record but this operator has no adapter for its backend")
        record = record_from(body) if has_record(body) else None
        if record is not None and self.metrics is not None:
            with contextlib.suppress(Exception):
                self.metrics.observe(record)
        if record is not None and record.settled:
            return True
        settled = await ObservingSupervisor(
            backend, self.store, listener=self.listener, poll_interval=self.poll_interval
        ).run(job)
        log.info("job %s settled: %s", job, settled.state, extra={"job": job})
        return True

    async def _initialize(self, job: str, body: Mapping[str, Any], backend: Backend, version: str) -> bool:
        """Plan on first sight and write the first record by compare-and-swap; refuse what cannot run."""
        try:
            spec = job_spec(body)
        except SpecError as error:
            await self._refuse(job, REASON_INVALID_SPEC, str(error), version)
            return False
        try:
            plan = make_plan(job, spec, backend.capabilities, supervised=True)
        except PlanError as error:
            if self.events is not None:
                with contextlib.suppress(Exception):
                    self.events.refused(job, error)
            if error.field is not None:  # spec.queue where Kueue cannot queue the job
                await self._refuse(job, REASON_UNQUEUEABLE, f"{error.field}: {error.reason}", version)
                return False
            await self._refuse(job, REASON_UNENFORCEABLE, f"rules[{error.rule}]: {error.reason}", version)
            return False
        try:
            await self.store.put(new_record(body, spec, plan), version)
        except VersionConflict:
            return False
        log.info("job %s planned: %s", job, plan.model_dump(mode="json"), extra={"job": job})
        return False  # read again: the supervisor starts from the written record

    async def _refuse(self, job: str, reason: str, message: str, version: str) -> None:
        with contextlib.suppress(VersionConflict):
            await self.store.refuse(job, reason, message, version)
            log.warning("job %s refused (%s): %s", job, reason, message, extra={"job": job})

    async def end_objects(self, job: str, backend: Backend) -> None:
        """End every object of ``job`` and wait until they have all ended (the finalizer's work).

        Ended objects are ended too: that deletes them and lets go of dispatch's finalizer on each,
        which would otherwise hold them once the garbage collector deletes them with the job."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + END_WAIT
        first = True
        while True:
            objects = await backend.list(job)
            live = [o for o in objects if o.phase is not Phase.ENDED or o.retained or first]
            first = False
            if not live:
                return
            for o in live:
                await backend.end(o.id)
            if loop.time() > deadline:
                raise kopf.TemporaryError(f"{len(live)} object(s) of {job} have not ended yet", delay=2)
            await asyncio.sleep(END_POLL)


async def _stopped(stopped: Any) -> None:
    await stopped.wait()


def register(registry: kopf.OperatorRegistry, runtime: Runtime) -> None:
    """Register the operator's handlers (closures over ``runtime``) in ``registry``."""

    @kopf.daemon(
        GROUP,
        VERSION,
        PLURAL,
        id="supervise",
        registry=registry,
        backoff=1.0,
        cancellation_timeout=5.0,
    )
    async def supervise(
        *, namespace: str | None, name: str, body: kopf.Body, stopped: kopf.DaemonStopped, **_: Any
    ) -> None:
        job = job_id(namespace or "", name)
        if runtime.events is not None:
            uid = body.get("metadata", {}).get("uid")
            if uid:
                with contextlib.suppress(Exception):
                    runtime.events.remember(job, str(uid))
        await runtime.supervise(job, stopped)

    @kopf.on.delete(GROUP, VERSION, PLURAL, id="end-objects", registry=registry)
    async def end_objects(*, namespace: str | None, name: str, body: kopf.Body, **_: Any) -> None:
        job = job_id(namespace or "", name)
        if not await runtime.until_leading_or_released(job):
            # A standby: the leader ended the objects and let go of the object.
            _forget(runtime, job)
            log.info("job %s deleted by the leader", job, extra={"job": job})
            return
        await runtime.stop(job)  # no create can land after the listing below
        backend = runtime.backend_of(body)
        if backend is None:
            _forget(runtime, job)
            return  # refused for want of an adapter: nothing was created by this operator
        await runtime.end_objects(job, backend)
        _forget(runtime, job)
        log.info("job %s deleted: every object has ended", job, extra={"job": job})


def _forget(runtime: Runtime, job: str) -> None:
    for keeper in (runtime.events, runtime.metrics):
        if keeper is not None:
            with contextlib.suppress(Exception):
                keeper.forget(job)

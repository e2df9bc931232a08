"""kopf's part of the operator: the deletion finalizer; and the Runtime the supervision loop shares.

Supervision is not kopf's: :mod:`dispatch._kube.loop` runs every DispatchJob in one work queue fed
by the record store's shared watch and the backends' (no daemon, no task per job), so the path from
a failure on the API server to the next record write never waits for kopf. kopf keeps the
admission webhooks, start-up, probes and the finalizer: its ``on.delete`` handler takes the job out
of the loop, ends every object of the job, and then lets kopf remove the finalizer.

Every handler returns None, so kopf writes nothing into ``.status``; the record is written only by
:class:`~dispatch._kube.store.KubeRecordStore` (PUT of /status carrying the resourceVersion read).

Leadership (``--leader-elect``): every replica runs kopf, so every replica serves the admission
webhooks, but only the Lease holder supervises. ``Runtime.leading`` is an :class:`asyncio.Event` the
elector sets once this process holds the Lease; the loop starts (its first read) only then, and the
deletion handler waits for it before it ends objects (which is what lets kopf remove the
finalizer). A standby's deletion handler returns only once the job is gone or no longer carries the
finalizer (the leader finished), so a standby never releases a DispatchJob itself. What kopf writes
in a standby is idempotent: the finalizer (a JSON patch guarded by the resourceVersion, the same
value in every replica).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import kopf

from .._api import SpecError, job_spec, new_record
from .._constants import (
    FINALIZER,
    GROUP,
    PLURAL,
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
from .loop import SupervisionLoop
from .store import KubeRecordStore

log = logging.getLogger("dispatch.operator")

FINAL_REFUSALS: Final = frozenset({REASON_UNENFORCEABLE, REASON_INVALID_SPEC, REASON_UNQUEUEABLE})
"""Refusals that stand for the object's generation. A missing backend does not: another replica
(or this one, restarted with the adapter configured) may supervise the job. A queue refused because
Kueue is not installed does: the spec is fixed, so the job is created again once Kueue is there."""
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
    loop: SupervisionLoop | None = None
    """The supervision loop (set by :meth:`start_loop`)."""
    final_refusals: frozenset[str] = field(default=FINAL_REFUSALS)

    @property
    def is_leading(self) -> bool:
        return self.leading is None or self.leading.is_set()

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

    def start_loop(self) -> SupervisionLoop:
        """Start supervising every job (call once this process holds the Lease)."""
        if self.loop is None:
            self.loop = SupervisionLoop(self)
        self.loop.start()
        return self.loop

    def abandon(self) -> None:
        """Stop supervising at once (the Lease was lost)."""
        if self.loop is not None:
            self.loop.abandon()

    def backend_of(self, body: Mapping[str, Any]) -> Backend | None:
        return self.backends.get(str((body.get("spec") or {}).get("backend", "")))

    async def stop(self, job: str) -> None:
        """Supervise ``job`` no more; returns once no step of it runs (no create lands after)."""
        if self.loop is not None:
            await self.loop.forget(job)

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


def register(registry: kopf.OperatorRegistry, runtime: Runtime) -> None:
    """Register the operator's handlers (closures over ``runtime``) in ``registry``."""

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

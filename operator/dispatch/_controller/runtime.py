"""The Runtime the supervision loop shares (store, backends, listener, leadership), and its refusals.

Supervision is not kopf's: :mod:`dispatch._controller.loop` runs every DispatchJob in one work queue fed
by the record store's shared watch and the backends' (no daemon, no task per job), and keeps the
deletion finalizer too, so kopf watches no resource: it keeps the admission webhooks, start-up and
the health endpoint's readiness.

The record is written only by the record store (:class:`~dispatch._controller.ports.DispatchJobStore`,
:class:`~dispatch._controller.store.KubeRecordStore`: a PUT of /status carrying the resourceVersion
read). The loop sees the Runtime as :class:`~dispatch._controller.ports.Supervising`: it plans and
refuses through :meth:`Runtime.initialize` and :meth:`Runtime.refuse`, and imports nothing of this
module.

Leadership (``--leader-elect``): every replica runs kopf, so every replica serves the admission
webhooks, but only the Lease holder supervises. ``Runtime.leading`` is an :class:`asyncio.Event` the
elector sets once this process holds the Lease; the loop starts (its first read) only then. A
standby runs no loop: it never writes a record, a finalizer or an object.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from .._constants import (
    REASON_INVALID_SPEC,
    REASON_UNENFORCEABLE,
    REASON_UNQUEUEABLE,
)
from .._decide import Authorize, apply, decide
from .._dispatchjob import SpecError, job_spec, new_record
from .._errors import PlanError, VersionConflict
from .._kubeclient import Body
from .._model import SUPERVISOR
from .._plan import make_plan
from .._protocols import Backend
from .._supervisor import log_step
from .loop import DEFAULT_WORKERS, SupervisionLoop
from .ports import DispatchJobStore, JobEvents, JobMetrics, Keeper, StepListener

log = logging.getLogger("dispatch.operator")

FINAL_REFUSALS: Final = frozenset({REASON_UNENFORCEABLE, REASON_INVALID_SPEC, REASON_UNQUEUEABLE})
"""Refusals that stand for the object's generation. A missing backend does not: another replica
(or this one, restarted with the adapter configured) may supervise the job. A queue refused because
Kueue is not installed does: the spec is fixed, so the job is created again once Kueue is there."""


@dataclass
class Runtime:
    """What the loop shares: the store, a backend per ``spec.backend``, the listener, options."""

    store: DispatchJobStore
    backends: Mapping[str, Backend]
    listener: StepListener | None = None
    poll_interval: float = 5.0
    events: JobEvents | None = None
    """The Event recorder (dispatch._controller.events), or None: no Events."""
    metrics: JobMetrics | None = None
    """The metrics (dispatch._controller.metrics), or None: told each record read and each job deleted."""
    unobserved: Mapping[str, Backend] = field(default_factory=dict)
    """The backends as opened, where ``backends`` wraps them to time what they show (the metrics'
    :meth:`~dispatch._controller.metrics.Metrics.observe_backend`); empty: ``backends`` are."""
    leading: asyncio.Event | None = None
    """Set while this process may supervise (holds the Lease); None: always (no leader election)."""
    loop: SupervisionLoop | None = None
    """The supervision loop (set by :meth:`start_loop`)."""
    workers: int = DEFAULT_WORKERS
    """The loop's turns in flight at once (``--workers``)."""
    final_refusals: frozenset[str] = field(default=FINAL_REFUSALS)
    settled_ttl: int | None = None
    """Seconds a settled job without ``spec.ttlSecondsAfterSettled`` is kept (``--settled-ttl-seconds``);
    None: until someone deletes it."""

    @property
    def is_leading(self) -> bool:
        return self.leading is None or self.leading.is_set()

    def lister(self, name: str) -> Backend:
        """The backend ``name`` as opened (past the metrics' wrapper): a settled job's ended objects
        are listed with it, as they are no failure to time."""
        return self.unobserved.get(name) or self.backends[name]

    def start_loop(self) -> SupervisionLoop:
        """Start supervising every job (call once this process holds the Lease)."""
        if self.loop is None:
            self.loop = SupervisionLoop(self, workers=self.workers)
        self.loop.start()
        return self.loop

    def abandon(self) -> None:
        """Stop supervising at once (the Lease was lost)."""
        if self.loop is not None:
            self.loop.abandon()

    async def initialize(self, job: str, body: Body, backend: Backend, version: str) -> bool:
        """Plan on first sight and write the first record by compare-and-swap; refuse what cannot run.

        True when the record written authorizes submission 1 (its create is the next step)."""
        try:
            spec = job_spec(body)
        except SpecError as error:
            await self.refuse(job, REASON_INVALID_SPEC, str(error), version)
            return False
        try:
            plan = make_plan(job, spec, backend.capabilities, supervised=True)
        except PlanError as error:
            if self.events is not None:
                with contextlib.suppress(Exception):
                    self.events.refused(job, error)
            if error.field is not None:  # spec.queue where Kueue cannot queue the job
                await self.refuse(job, REASON_UNQUEUEABLE, f"{error.field}: {error.reason}", version)
                return False
            await self.refuse(job, REASON_UNENFORCEABLE, f"rules[{error.rule}]: {error.reason}", version)
            return False
        planned = new_record(body, spec, plan)
        # The first decision on a planned record is pure (nothing is authorized, so no object can
        # be the job's yet): write the plan and the authorization of submission 1 in one
        # compare-and-swap, one API write fewer per job than two records.
        first = decide(planned, ())
        record = planned
        if isinstance(first.step, Authorize):
            record = apply(planned, first.step, actor=SUPERVISOR, now=self.store.clock())
        try:
            await self.store.put(record, version)
        except VersionConflict:
            return False
        log.info("job %s planned: %s", job, plan.model_dump(mode="json"), extra={"job": job})
        if record is not planned:
            log_step(job, first.step, first, planned)  # as the supervisor logs every step
            if self.listener is not None:
                self.listener.stepped(job, first.step, planned, record)
        return record is not planned  # read again: the supervisor starts from the written record

    async def refuse(self, job: str, reason: str, message: str, version: str) -> None:
        """Write the job's refusal at ``version``; a lost compare-and-swap is not an error (the
        winner's event brings the job back)."""
        with contextlib.suppress(VersionConflict):
            await self.store.refuse(job, reason, message, version)
            log.warning("job %s refused (%s): %s", job, reason, message, extra={"job": job})

    def forget_keepers(self, job: str) -> None:
        """The job is gone: events and metrics forget it."""
        keepers: tuple[Keeper | None, ...] = (self.events, self.metrics)
        for keeper in keepers:
            if keeper is not None:
                with contextlib.suppress(Exception):
                    keeper.forget(job)

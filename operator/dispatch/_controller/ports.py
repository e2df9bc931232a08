"""The typed seams inside the operator process: what each part asks of the others.

The supervision loop (:mod:`~dispatch._controller.loop`) asks the runtime for what it shares
(:class:`Supervising`, which :class:`~dispatch._controller.runtime.Runtime` is), the record store for
the DispatchJobs its watch shows and the writes (:class:`DispatchJobStore`, which
:class:`~dispatch._controller.store.KubeRecordStore` is), the Event recorder (:class:`JobEvents`) and
the metrics (:class:`JobMetrics`) for what they keep per job. Each part is annotated with these, not
with another's class, so the parts import each other one way: the runtime imports the loop, the loop
imports none of the runtime, the events or the metrics.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from .._errors import PlanError
from .._model import Cause, Cost, ObjectView, Record, State
from .._protocols import Backend, RecordStore
from .._supervisor import Listener

if TYPE_CHECKING:  # for the annotations only: the webhook imports this module without the store's client
    from .._kubeclient import Body
    from .store import JobView, OnEvent


class StepListener(Listener, Protocol):
    """The operator's listener (:class:`~dispatch._controller.listeners.Fanout`): the core's
    :class:`~dispatch._supervisor.Listener`, also told when a job's object is held outside dispatch."""

    def held(self, job: str, note: str) -> None:
        """The job's current object is held outside dispatch; ``note`` says by whom."""


class DispatchJobStore(RecordStore, Protocol):
    """The record store as the operator's parts use it: the core's
    :class:`~dispatch._protocols.RecordStore`, the shared DispatchJob watch and its projections
    (:class:`~dispatch._controller.store.JobView`), and the status writes besides a record's."""

    @property
    def clock(self) -> Callable[[], datetime]:
        """The time a record write stamps."""

    async def put(
        self,
        record: Record,
        expected: str,
        observed: Mapping[str, str] | None = None,
        cost: Cost | None = None,
    ) -> str:
        """Write ``record`` at version ``expected`` (VersionConflict when stale), with ``observed``
        (the observed fields its decision shows; None: those of version ``expected``) and ``cost``
        (what recovery cost; None: what the record alone says). Returns the new version."""

    def watch_all(self, on_event: OnEvent, on_synced: Callable[[], None] | None = None) -> None:
        """Tell ``on_event`` about every DispatchJob event; ``on_synced`` once the first list is whole."""

    async def view(self, job: str) -> JobView:
        """The job's last version, from the watch's cache or the API server."""

    def record(self, job: str, view: JobView) -> Record:
        """The record ``view`` holds (JobNotFound when none)."""

    def knows(self, job: str) -> bool:
        """True when the shared watch has shown ``job`` (no request)."""

    async def read(self, job: str) -> Body:
        """The DispatchJob as the API server has it now."""

    async def set_finalizers(self, job: str, finalizers: list[str], expected: str) -> None:
        """Set ``metadata.finalizers`` at version ``expected`` (VersionConflict when stale)."""

    async def refuse(self, job: str, reason: str, message: str, expected: str) -> str:
        """Write a status without a record: the job is refused."""

    async def delete(self, job: str, expected: str) -> None:
        """Delete the DispatchJob at version ``expected`` (VersionConflict when stale)."""

    def observed(self, job: str) -> dict[str, str]:
        """The observed fields of the last version of ``job`` this store read or wrote."""

    async def observe(
        self, job: str, state: State, cause: Cause, expected: str, note: str = "", cost: Cost | None = None
    ) -> str | None:
        """Write the observed fields (and ``cost`` with them) when they changed; the new version,
        None when unchanged."""

    async def owner_reference(self, api: object, namespace: str, name: str) -> Mapping[str, Any]:
        """The DispatchJob as the controlling ownerReference of its objects."""


class Keeper(Protocol):
    """A part that keeps something per job, until the job is gone."""

    def forget(self, job: str) -> None:
        """The job is gone (its finalizer let go of it)."""


class JobEvents(Keeper, Protocol):
    """What the loop and the runtime ask of the Event recorder
    (:class:`~dispatch._controller.events.EventRecorder`)."""

    def remember(self, job: str, uid: str) -> None:
        """The DispatchJob's uid, for the Events' regarding reference."""

    def refused(self, job: str, error: PlanError) -> None:
        """Post why the job's plan was refused."""

    def waiting(self, job: str, reason: str, message: str) -> None:
        """Post why the job waits before anything is created (a backend no operator serves yet)."""

    def expired(self, job: str, note: str) -> None:
        """Post that the job is deleted now that its time to live has passed, with its final record."""

    def hold_while(self, held: Callable[[], bool] | None) -> None:
        """Hold Events back while ``held()`` says recoveries wait (None: never)."""


class JobMetrics(Keeper, Protocol):
    """What the loop and the runtime ask of the metrics (:class:`~dispatch._controller.metrics.Metrics`)."""

    def observe(self, record: Record) -> None:
        """Count the job in its recorded state (each record read)."""

    def observe_state(self, job: str, state: State) -> None:
        """Count the job in its recorded state, read without its record (a settled job's view)."""

    def decided(self, jobs: int, seconds: float) -> None:
        """Every job of the first list after a start has been decided once."""

    def costs(self, backend: str, record: Record, objects: Sequence[ObjectView]) -> None:
        """Count what recovery cost the job, as a decision on ``record`` and ``objects`` shows it."""


class Configured(Protocol):
    """What the admission webhooks ask of the runtime: the backends this operator configured."""

    @property
    def backends(self) -> Mapping[str, Backend]:
        """A backend per ``spec.backend``, as the supervisors use them."""


class Supervising(Configured, Protocol):
    """What the supervision loop asks of the runtime it supervises for."""

    @property
    def store(self) -> DispatchJobStore: ...

    @property
    def listener(self) -> StepListener | None: ...

    @property
    def poll_interval(self) -> float: ...

    @property
    def events(self) -> JobEvents | None: ...

    @property
    def metrics(self) -> JobMetrics | None: ...

    @property
    def settled_ttl(self) -> int | None:
        """Seconds a settled job without a time to live of its own is kept; None: kept until deleted."""

    @property
    def final_refusals(self) -> frozenset[str]:
        """Refusals that stand for the object's generation: no turn plans such a job again."""

    def lister(self, name: str) -> Backend:
        """The backend ``name`` to list a settled job's objects with (past the metrics' wrapper)."""

    async def initialize(self, job: str, body: Body, backend: Backend, version: str) -> bool:
        """Plan a job on first sight (or refuse it); True when submission 1 is authorized."""

    async def refuse(self, job: str, reason: str, message: str, version: str) -> None:
        """Write the job's refusal (a lost compare-and-swap is not an error)."""

    def forget_keepers(self, job: str) -> None:
        """The job is gone: events and metrics forget it."""

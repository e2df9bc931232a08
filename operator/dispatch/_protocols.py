"""The two ports the core is written against: a scheduler backend and a record store."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import NamedTuple, Protocol, runtime_checkable

from ._model import Capabilities, JobSpec, ObjectView, Plan, Record

Unsubscribe = Callable[[], None]
Wake = Callable[[], None]


@runtime_checkable
class Backend(Protocol):
    """A scheduler, seen through what dispatch needs of it.

    Every object is created held back (it cannot start) and tagged with its (job, submission) so it
    can be found again after a crash; only :meth:`release` lets it start. All methods are safe to
    repeat.
    """

    @property
    def name(self) -> str: ...

    @property
    def capabilities(self) -> Capabilities: ...

    async def create(self, job: str, submission: int, spec: JobSpec, plan: Plan) -> str:
        """Create the object held back and tagged; return its id. ``spec`` is the spec this
        submission runs with (:func:`dispatch.spec_for`: the job's, with the changes of the rules
        that authorized the submissions so far), which the object is built from.

        May raise :class:`~dispatch.ObjectExists` where object names are deterministic.
        """
        ...

    async def release(self, object_id: str) -> None: ...

    async def end(self, object_id: str, *, grace_seconds: int | None = None) -> None:
        """End the object whatever its phase. Ending an ended or vanished object is not an error.

        ``grace_seconds``: between SIGTERM and SIGKILL, where the scheduler takes it per stop (a
        pod's deletion); None, or a scheduler that cannot (Slurm's KillWait): its own."""
        ...

    async def list(self, job: str) -> Sequence[ObjectView]:
        """Every object tagged with ``job``, as the scheduler shows it now."""
        ...

    def subscribe(self, job: str, wake: Wake) -> Unsubscribe:
        """Call ``wake`` (from the event loop's thread) whenever ``job``'s objects may have changed."""
        ...

    async def aclose(self) -> None: ...


@runtime_checkable
class Previewing(Protocol):
    """A backend that can show, without any request, the object a submission of a spec would be:
    the admission webhook measures it against the API server's object size limit, so a job whose
    object could never be created is refused at apply instead of failing ``launch-failed``."""

    def preview(self, job: str, spec: JobSpec, plan: Plan) -> Mapping[str, object]:
        """The body :meth:`Backend.create` would send for submission 1 of ``job``."""
        ...


@runtime_checkable
class Admitting(Protocol):
    """A backend that runs a job only within limits its configuration sets by namespace (Slurm's
    identities): the admission webhook asks it, so a job outside them is refused at apply."""

    def admit(self, job: str, spec: JobSpec) -> None:
        """Raise :class:`~dispatch._errors.OutsideLimits`, naming the field, when ``job``
        (``<namespace>/<name>``) may not run ``spec``."""
        ...


@runtime_checkable
class Confirming(Protocol):
    """A backend whose :meth:`Backend.list` answers from a cache that may lag a write made by another
    process (a watch cache). Before a canonical the cache does not show counts as vanished, the
    supervisor asks it to look the object up on the scheduler itself."""

    async def confirm(self, job: str, object_id: str) -> Sequence[ObjectView]:
        """``list(job)`` again, once ``object_id`` has been looked up on the scheduler directly."""
        ...


@runtime_checkable
class Quiescing(Protocol):
    """A backend whose :meth:`Backend.list` may show an object ended before a write of its own that
    makes it so has landed (a stop in flight). The supervisor calls :meth:`quiesce` before it records
    a job settled, the one step such an object must not precede; every other step goes on at once
    (the next submission's release is fenced by the backend itself)."""

    async def quiesce(self, job: str) -> None:
        """Return once every such write for ``job``'s objects has landed; raise if one cannot."""
        ...


@runtime_checkable
class SelfWaking(Protocol):
    """A backend that wakes a job whenever :meth:`Backend.list` may answer differently for it: on
    every change its watches see, and on timers of its own at the moments no event announces (a
    clock-dependent verdict's due time, a node to look up again). The operator's loop leaves such a
    backend's jobs out of its periodic look (every job's turn after a quiet ``poll_interval``), which
    would otherwise cost one turn per job per interval however idle the jobs are."""

    @property
    def wakes_itself(self) -> bool:
        """True when the promise above holds (a wrapper may forward it from what it wraps)."""
        ...


@runtime_checkable
class Overseeing(Protocol):
    """A backend that sees every job's objects at once (shared watches, a shared poll), so that
    :meth:`Backend.list` costs no request of its own, and that tells about a change of the objects
    of a job nobody subscribed to. The operator lets go of a settled job; an object created for it
    after it settled, by a creator that died before it could end what it made (docs/semantics.md,
    invariant 5), would otherwise stay held until the job is deleted."""

    def subscribe_others(self, wake: Callable[[str], None]) -> Unsubscribe:
        """Call ``wake(job)`` whenever :meth:`Backend.list` may answer differently for a ``job`` that
        has no subscriber (:meth:`Backend.subscribe`)."""
        ...


class Versioned(NamedTuple):
    record: Record
    version: str


@runtime_checkable
class RecordStore(Protocol):
    """Durable records with compare-and-swap. Versions are opaque strings."""

    async def create(self, record: Record) -> str:
        """Store a new record; raise :class:`~dispatch.JobExists` if the job has one."""
        ...

    async def get(self, job: str) -> Versioned:
        """The record and its version; raise :class:`~dispatch.JobNotFound`."""
        ...

    async def put(self, record: Record, expected: str) -> str:
        """Replace the record only if it is still at ``expected``; return the new version.

        Raise :class:`~dispatch.VersionConflict` when it is not.
        """
        ...

    def subscribe(self, job: str, wake: Wake) -> Unsubscribe:
        """Call ``wake`` whenever ``job``'s record may have changed."""
        ...


class Others:
    """The callbacks of :meth:`Overseeing.subscribe_others`: what each overseeing backend keeps to
    implement it. Iterating gives a copy, so a callback may unsubscribe while it is told."""

    __slots__ = ("_wakes",)

    def __init__(self) -> None:
        self._wakes: list[Callable[[str], None]] = []

    def subscribe(self, wake: Callable[[str], None]) -> Unsubscribe:
        self._wakes.append(wake)

        def unsubscribe() -> None:
            with contextlib.suppress(ValueError):
                self._wakes.remove(wake)

        return unsubscribe

    def __iter__(self) -> Iterator[Callable[[str], None]]:
        return iter(list(self._wakes))

    def clear(self) -> None:
        self._wakes.clear()


class Subscribers:
    """Wake callbacks by job: what every backend and store needs to implement ``subscribe``."""

    __slots__ = ("_table",)

    def __init__(self) -> None:
        self._table: dict[str, list[Wake]] = {}

    def subscribe(self, job: str, wake: Wake) -> Unsubscribe:
        self._table.setdefault(job, []).append(wake)

        def unsubscribe() -> None:
            wakes = self._table.get(job)
            if wakes is not None and wake in wakes:
                wakes.remove(wake)
                if not wakes:
                    del self._table[job]

        return unsubscribe

    def notify(self, job: str) -> None:
        for wake in self._table.get(job, ()):
            wake()

    def jobs(self) -> list[str]:
        return list(self._table)

    def clear(self) -> None:
        self._table.clear()

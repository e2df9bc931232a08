"""The in-memory adapter: a scheduler in a dict, shaped like Slurm or like Kubeflow.

It is the embedded default (no cluster needed) and the scheduler of the core's tests. Its
:class:`Env` plays the scheduler's part: run, complete, preempt, lose the node and so on. The two
shapes differ where the real schedulers differ: object names (Slurm numbers its jobs; a
PyTorchJob's name is chosen by its creator, so a second creator hits AlreadyExists) and what the
scheduler enforces natively: Kubeflow restarts failed pods in place up to ``backoffLimit``, exactly
as a rule says; Slurm enforces no recovery rule exactly (see ``dispatch._backends.slurm``), so every rule of
the slurm shape goes to the supervisor.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Final

from ... import _registry
from ..._config import choice, flag, known_keys
from ..._errors import InvalidTransition, ObjectExists
from ..._model import (
    Action,
    Capabilities,
    Cause,
    CauseKind,
    Enforcer,
    JobSpec,
    ObjectView,
    Phase,
    Plan,
    StopKind,
)
from ..._protocols import Subscribers, Unsubscribe, Wake
from .. import kubeflow, slurm


class Shape(StrEnum):
    """Which real scheduler the memory adapter imitates: names of objects and native capabilities."""

    SLURM = "slurm"
    KUBEFLOW = "kubeflow"


CAPABILITIES: Final = {
    # Each shape enforces exactly what its real scheduler does: read from the one source.
    Shape.SLURM: slurm.CAPABILITIES,
    Shape.KUBEFLOW: kubeflow.CAPABILITIES,
}


def shapes() -> list[str]:
    """What ``shape`` may be: slurm, kubeflow, or any other backend a DispatchJob may name."""
    own = [s.value for s in Shape]
    return [*own, *(b.name for b in _registry.spec_backends() if b.name not in own)]


def _imitation(name: str) -> tuple[str, Shape, Capabilities]:
    """The backend imitated, its object naming (Slurm's numbers or Kubernetes' chosen names) and its
    capabilities: another backend's come from its registry entry, never a copy."""
    if name in {s.value for s in Shape}:
        return name, Shape(name), _in_memory(CAPABILITIES[Shape(name)])
    info = _registry.get(name)
    if info is None or not info.in_spec:
        raise ValueError(f"shape must be one of {', '.join(shapes())}, not {name!r}")
    naming = Shape.SLURM if info.where is _registry.Where.EXTERNAL else Shape.KUBEFLOW
    return name, naming, _in_memory(info.capabilities)


def _in_memory(caps: Capabilities) -> Capabilities:
    """What the memory scheduler does of ``caps``: no Kueue (a job with spec.queue is refused by the
    plan, not run unqueued) and no clock of its own (the supervisor enforces a time limit; a test
    ends an object at the scheduler's limit with :meth:`Env.time_limit`)."""
    if not (caps.queues or caps.time_limit or caps.warning_signal or caps.stop_grace):
        return caps
    return caps.model_copy(
        update={"queues": False, "time_limit": None, "warning_signal": False, "stop_grace": None}
    )


# Causes are immutable: one instance each, shared by every object that ends that way.
_CANCELLED: Final = Cause(kind=CauseKind.NONE, detail="cancelled")
_COMPLETED: Final = Cause(kind=CauseKind.NONE)
_PREEMPTED: Final = Cause(kind=CauseKind.PREEMPTED, detail="preempted by a higher-priority job")
_NODE_LOST: Final = Cause(kind=CauseKind.NODE_LOST, detail="node stopped responding")
_OUT_OF_MEMORY: Final = Cause(kind=CauseKind.OUT_OF_MEMORY, detail="OOMKilled", exit_code=137, signal=9)
_TIME_LIMIT: Final = Cause(kind=CauseKind.TIME_LIMIT, detail="time limit reached")
_LAUNCH_FAILED: Final = Cause(kind=CauseKind.LAUNCH_FAILED, detail="could not start the program")
_NO_CAPACITY: Final = Cause(kind=CauseKind.NO_CAPACITY, detail="no nodes can ever fit it")
_REQUEUED: Final = Cause(kind=CauseKind.REQUEUED, detail="handed back by the scheduler")
_KILLED: Final = {StopKind.FORCED: 9}
_STOPPED: Final = {
    kind: Cause(kind=CauseKind.NONE, detail="cancelled", stop=kind, signal=_KILLED.get(kind))
    for kind in StopKind
}
_VIEW_FIELDS: Final = {"id", "job", "submission", "phase", "cause", "cancelled", "restarts", "started_at"}
"""Shared by every snapshot (pydantic copies it before changing it), so a view costs no set of its own."""


@dataclass(slots=True)
class _Entry:
    id: str
    job: str
    submission: int
    phase: Phase = Phase.HELD
    cause: Cause | None = None
    cancelled: bool = False
    restarts: int = 0
    ever_released: bool = False
    started_at: datetime | None = None
    traps_sigterm: bool = True
    """The program exits within its grace period on SIGTERM (False: a stop kills it at the end)."""
    native: tuple[tuple[frozenset[CauseKind], int], ...] = ()
    spec: JobSpec | None = field(default=None, repr=False)
    """The spec it was created from: its submission's (a rule's change included)."""
    view: ObjectView | None = field(default=None, repr=False)

    def snapshot(self) -> ObjectView:
        if self.view is None:
            self.view = ObjectView.model_construct(
                _VIEW_FIELDS,
                id=self.id,
                job=self.job,
                submission=self.submission,
                phase=self.phase,
                cause=self.cause,
                cancelled=self.cancelled,
                restarts=self.restarts,
                started_at=self.started_at,
            )
            if self.cause is not None and self.cause.stop is not None:
                self.view = self.view.model_copy(update={"stop": self.cause.stop})
        return self.view


def _utcnow() -> datetime:
    return datetime.now(UTC)


class MemoryBackend:
    """A :class:`~dispatch.Backend` whose scheduler is :attr:`env`."""

    def __init__(
        self,
        shape: Shape | str = Shape.SLURM,
        *,
        auto_run: bool = False,
        clock: Callable[[], datetime] = _utcnow,
    ) -> None:
        self.imitates, self.shape, self._capabilities = _imitation(str(shape))
        self.auto_run = auto_run
        self.clock = clock
        """The scheduler's clock: when an object begins running (its ``started_at``)."""
        self._entries: dict[str, _Entry] = {}
        self._by_job: dict[str, list[_Entry]] = {}
        self._subscribers = Subscribers()
        self._counter = 0
        self.peak_released: dict[str, int] = {}
        """The most objects of one job ever released and not ended at the same moment."""
        self.env = Env(self)

    @property
    def name(self) -> str:
        return f"memory-{self.imitates}"

    @property
    def capabilities(self) -> Capabilities:
        return self._capabilities

    async def create(self, job: str, submission: int, spec: JobSpec, plan: Plan) -> str:
        if self.shape is Shape.KUBEFLOW:
            object_id = f"{job}-{submission}"
            if object_id in self._entries:
                raise ObjectExists(object_id)
        else:
            self._counter += 1
            object_id = str(self._counter)
        # A scheduler-enforced rule's budget belongs to the job: this object may restart only what
        # earlier submissions left (the plan carries their recorded firings).
        native = tuple(
            (frozenset(rule.on), rule.left)
            for rule in plan.rules
            if rule.enforcer is Enforcer.SCHEDULER and rule.action is Action.RESTART
        )
        entry = _Entry(id=object_id, job=job, submission=submission, native=native, spec=spec)
        self._entries[object_id] = entry
        self._by_job.setdefault(job, []).append(entry)
        self._changed(entry)
        return object_id

    async def release(self, object_id: str) -> None:
        entry = self._entry(object_id)
        if entry.phase is not Phase.HELD:
            return
        entry.ever_released = True
        if self.auto_run:
            self._running(entry)
        else:
            entry.phase = Phase.QUEUED
        released = sum(1 for e in self._by_job[entry.job] if e.phase in (Phase.QUEUED, Phase.RUNNING))
        if released > self.peak_released.get(entry.job, 0):
            self.peak_released[entry.job] = released
        self._changed(entry)

    async def end(self, object_id: str, *, grace_seconds: int | None = None) -> None:
        entry = self._entries.get(object_id)
        if entry is None or entry.phase is Phase.ENDED:
            return
        stop = None
        if entry.phase is Phase.RUNNING:  # the program ran: SIGTERM, then SIGKILL after its grace
            stop = StopKind.GRACEFUL if entry.traps_sigterm else StopKind.FORCED
        entry.phase = Phase.ENDED
        entry.cancelled = True
        entry.cause = _CANCELLED if stop is None else _STOPPED[stop]
        self._changed(entry)

    async def list(self, job: str) -> Sequence[ObjectView]:
        return [e.snapshot() for e in self._by_job.get(job, ())]

    def subscribe(self, job: str, wake: Wake) -> Unsubscribe:
        return self._subscribers.subscribe(job, wake)

    async def aclose(self) -> None:
        self._subscribers.clear()

    def objects(self) -> Sequence[ObjectView]:
        """Every object of every job (for tests and benchmarks)."""
        return [e.snapshot() for e in self._entries.values()]

    def ever_released(self, object_id: str) -> bool:
        return self._entry(object_id).ever_released

    def spec_of(self, object_id: str) -> JobSpec | None:
        """The spec the object was created from, as a real scheduler's object holds it in its own
        fields (a pod's memory, a Slurm job's partition)."""
        return self._entry(object_id).spec

    def _entry(self, object_id: str) -> _Entry:
        try:
            return self._entries[object_id]
        except KeyError:
            raise InvalidTransition(f"no object {object_id!r}") from None

    def _running(self, entry: _Entry) -> None:
        entry.phase = Phase.RUNNING
        if entry.started_at is None:  # the first start: an in-place restart keeps it
            entry.started_at = self.clock()

    def _changed(self, entry: _Entry) -> None:
        entry.view = None
        self._subscribers.notify(entry.job)


class Env:
    """The scheduler's side of the memory backend: what happens to objects on their own."""

    def __init__(self, backend: MemoryBackend) -> None:
        self._backend = backend

    def run(self, object_id: str) -> None:
        """Start a released object (what a scheduler with free nodes does; ``auto_run`` does it at once)."""
        entry = self._in(object_id, Phase.QUEUED)
        self._backend._running(entry)
        self._backend._changed(entry)

    def ignore_sigterm(self, object_id: str) -> None:
        """The program does not exit on SIGTERM: a stop kills it when its grace period ends."""
        self._backend._entry(object_id).traps_sigterm = False

    def complete(self, object_id: str) -> None:
        self._end(object_id, _COMPLETED, Phase.RUNNING)

    def preempt(self, object_id: str) -> None:
        self._end(object_id, _PREEMPTED)

    def lose_node(self, object_id: str) -> None:
        self._end(object_id, _NODE_LOST)

    def out_of_memory(self, object_id: str) -> None:
        self._end(object_id, _OUT_OF_MEMORY)

    def time_limit(self, object_id: str) -> None:
        """The scheduler's own time limit stopped it (SIGTERM, then SIGKILL after the grace)."""
        entry = self._backend._entry(object_id)
        stop = StopKind.GRACEFUL if entry.traps_sigterm else StopKind.FORCED
        self._end(object_id, _TIME_LIMIT.model_copy(update={"stop": stop}))

    def exit(self, object_id: str, code: int) -> None:
        """The program ended by itself with ``code``; 0 is success."""
        if code == 0:
            self.complete(object_id)
            return
        cause = Cause(kind=CauseKind.NON_ZERO_EXIT, detail=f"exited with code {code}", exit_code=code)
        self._end(object_id, cause)

    def fail_launch(self, object_id: str) -> None:
        cause = _LAUNCH_FAILED
        self._end(object_id, cause, Phase.QUEUED, Phase.RUNNING)

    def no_capacity(self, object_id: str) -> None:
        cause = _NO_CAPACITY
        self._end(object_id, cause, Phase.QUEUED)

    def requeue(self, object_id: str) -> None:
        self._end(object_id, _REQUEUED)

    def _in(self, object_id: str, *phases: Phase) -> _Entry:
        entry = self._backend._entry(object_id)
        if entry.phase not in phases:
            wanted = " or ".join(phases)
            raise InvalidTransition(f"object {object_id} is {entry.phase}, not {wanted}")
        return entry

    def _end(self, object_id: str, cause: Cause, *phases: Phase) -> None:
        entry = self._in(object_id, *(phases or (Phase.RUNNING,)))
        for causes, budget in entry.native:
            if cause.kind in causes and entry.restarts < budget:
                entry.restarts += 1
                if self._backend.auto_run:
                    self._backend._running(entry)
                else:
                    entry.phase = Phase.QUEUED
                self._backend._changed(entry)
                return
        entry.phase = Phase.ENDED
        entry.cause = cause
        self._backend._changed(entry)


def open_adapter(config: Mapping[str, object] | None = None) -> MemoryBackend:
    """Entry point ``dispatch.adapters: memory``. Config: ``shape`` (:func:`shapes`), ``auto_run``.

    Values may be text (from YAML, the environment or a command line): ``auto_run: "false"`` is
    false and ``"maybe"`` is a :class:`~dispatch.ConfigError` naming the key.
    """
    config = dict(config or {})
    known_keys("memory", config, {"shape", "auto_run"})
    shape = choice("memory", config, "shape", Shape.SLURM.value, shapes())
    return MemoryBackend(shape, auto_run=flag("memory", config, "auto_run", False))


__all__ = ["CAPABILITIES", "Env", "InvalidTransition", "MemoryBackend", "Shape", "open_adapter"]

"""The operator's observed fields for a job that waits: what ``status.observedNote`` shows, when it is
written, and when it waits for recoveries (``ObservingSupervisor.prepare``, the loop's wiring)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest

from dispatch._controller.observed import ObservingSupervisor
from dispatch._controller.store import KubeRecordStore
from dispatch._decide import Decision, Wait
from dispatch._model import (
    NO_CAUSE,
    Actor,
    ActorKind,
    Cause,
    CauseKind,
    Cost,
    JobSpec,
    ObjectView,
    Phase,
    Plan,
    Record,
    State,
    Submission,
)
from dispatch._supervisor import Intent, Supervisor

JOB = "ns/a"
T0 = datetime(2026, 12, 6, tzinfo=UTC)
WHO = Actor(kind=ActorKind.SUPERVISOR, id="supervisor")
WAITING = "pod a-1-master-0 unschedulable (no-capacity at 2026-12-06T00:05:00Z): 0/8 nodes are available"


class Store(KubeRecordStore):
    """Only what ``ObservingSupervisor.prepare`` asks of the record store: the observed fields shown
    now, and the write of new ones."""

    def __init__(self, shown: dict[str, str]) -> None:
        super().__init__(cast(Any, object()))
        self.shown = shown
        self.notes: list[str] = []
        self.puts: list[tuple[str, Mapping[str, str] | None]] = []
        self.costs: list[Cost | None] = []

    def observed(self, job: str) -> dict[str, str]:
        return dict(self.shown)

    async def observe(
        self, job: str, state: State, cause: Any, expected: str, note: str = "", cost: Cost | None = None
    ) -> str | None:
        self.notes.append(note)
        self.costs.append(cost)
        return "2"

    async def put(
        self,
        record: Record,
        expected: str,
        observed: Mapping[str, str] | None = None,
        cost: Cost | None = None,
    ) -> str:
        self.puts.append((expected, observed))
        self.costs.append(cost)
        return "2"


class Listener:
    """The part of the operator's listener a hold is told to (the EventRecorder's Warning)."""

    def __init__(self) -> None:
        self.holds: list[str] = []

    def held(self, job: str, note: str) -> None:
        self.holds.append(note)


def intent(*, waiting: str = "", note: str = "") -> Intent:
    record = Record(
        job=JOB,
        spec=JobSpec(name="a", command=("train",)),
        plan=Plan(job=JOB),
        submitted_by=WHO,
        submitted_at=T0,
        supervised=True,
        submissions=(Submission(n=1, authorized_at=T0, authorized_by=WHO, canonical="ns/a-1"),),
    )
    view = ObjectView(id="ns/a-1", job=JOB, submission=1, phase=Phase.QUEUED, waiting=waiting, note=note)
    return Intent(record, "1", (view,), Decision(Wait("queued on the scheduler"), State.PENDING, NO_CAUSE))


def supervisor(
    monkeypatch: pytest.MonkeyPatch, store: Store, prepared: Intent
) -> tuple[ObservingSupervisor, Listener]:
    async def prepare(self: Supervisor, job: str) -> Intent:
        return prepared

    monkeypatch.setattr(Supervisor, "prepare", prepare)
    listener = Listener()
    return ObservingSupervisor(cast(Any, object()), store, listener=cast(Any, listener)), listener


async def test_a_wait_for_capacity_is_written_with_no_event_of_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = Store({"observedState": "pending"})
    observing, listener = supervisor(monkeypatch, store, intent(waiting=WAITING))
    await observing.prepare(JOB)
    assert store.notes == [WAITING]
    assert listener.holds == []  # kube-scheduler's FailedScheduling is on the pod


async def test_a_hold_outside_dispatch_is_written_with_an_event(monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store({"observedState": "pending", "observedNote": WAITING})
    hold = "suspended by kueue after dispatch released it"
    observing, listener = supervisor(monkeypatch, store, intent(waiting=WAITING, note=hold))
    await observing.prepare(JOB)
    assert store.notes == [hold]  # the hold comes first: it is what keeps the job from running
    assert listener.holds == [hold]


async def test_a_note_alone_waits_while_recoveries_do(monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store({"observedState": "pending"})
    observing, _ = supervisor(monkeypatch, store, intent(waiting=WAITING))
    asked: list[str] = []

    def recoveries_wait(job: str) -> bool:
        asked.append(job)
        return True

    observing.defer_note = recoveries_wait
    await observing.prepare(JOB)
    assert (asked, store.notes) == ([JOB], [])
    observing.defer_note = lambda job: False  # none waits any more
    await observing.prepare(JOB)
    assert store.notes == [WAITING]


async def test_a_change_of_state_is_never_put_off(monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store({"observedState": "running"})
    observing, _ = supervisor(monkeypatch, store, intent(waiting=WAITING))
    observing.defer_note = lambda job: True
    await observing.prepare(JOB)
    assert store.notes == [WAITING]


async def test_the_loop_puts_notes_behind_recoveries_waiting_for_a_worker() -> None:
    """The loop wires its supervisors to its urgent lane while it runs: a note-only write waits
    while a recovery waits for a worker, and the job goes back to the routine lane."""
    from dispatch._backends.memory._adapter import MemoryBackend
    from dispatch._controller.runtime import Runtime

    class Watching:
        def watch_all(self, on_event: object, on_synced: object) -> None:
            pass

    runtime = Runtime(store=cast(Any, Watching()), backends={"memory": MemoryBackend()}, workers=1)
    loop = runtime.start_loop()
    try:
        [observing] = loop.supervisors.values()
        defer = observing.defer_note
        assert defer is not None
        queue = loop.queue
        for job in ("ns/recovering", JOB):
            queue.pending[job] = None
        assert defer(JOB) is False  # nothing waits: the note is written now
        queue.queued.add("ns/recovering")
        queue.lanes[0].append("ns/recovering")  # a recovery waiting for a worker
        queue.busy.add(JOB)  # the note's job is in its turn
        assert defer(JOB) is True
        assert JOB in queue.dirty  # looked at again after this turn,
        assert JOB not in queue.dirty_urgent  # in the routine lane
        queue.busy.discard(JOB)
    finally:
        await loop.stop()
    assert observing.defer_note is None
    await asyncio.sleep(0)


async def test_a_record_write_carries_what_its_decision_shows(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ObservingSupervisor.write``: the observed fields (the note too) go to the store's ``put`` as
    its argument, with the record, at the intent's version."""
    store = Store({"observedState": "running"})
    prepared = intent(waiting=WAITING)
    observing, _ = supervisor(monkeypatch, store, prepared)
    await observing.write(prepared, prepared.record)
    shows = {"observedState": "pending", "observedNote": WAITING}
    assert store.puts == [("1", shows)]


async def test_the_write_that_shows_the_next_submission_running_carries_what_recovery_cost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The recovery ends when submission 2 begins running: the observe write that says ``running``
    is the one that writes it, with the start only the live object shows."""
    preempted = Cause(kind=CauseKind.PREEMPTED)
    first = Submission(
        n=1,
        authorized_at=T0,
        authorized_by=WHO,
        canonical="ns/a-1",
        cause=preempted,
        started_at=T0 + timedelta(seconds=10),
        ended_at=T0 + timedelta(seconds=70),
    )
    second = Submission(
        n=2, authorized_at=T0 + timedelta(seconds=70), authorized_by=WHO, rule=0, canonical="ns/a-2"
    )
    base = intent()
    record = base.record.model_copy(update={"submissions": (first, second)})
    view = ObjectView(
        id="ns/a-2", job=JOB, submission=2, phase=Phase.RUNNING, started_at=T0 + timedelta(seconds=75)
    )
    shown = Intent(record, "1", (view,), Decision(Wait("running"), State.RUNNING, NO_CAUSE))
    store = Store({"observedState": "recovering", "observedCause": "preempted"})
    observing, _ = supervisor(monkeypatch, store, shown)
    await observing.prepare(JOB)
    (cost,) = store.costs
    assert cost is not None
    assert (cost.failures, cost.recovered, cost.recovery_seconds, cost.node_seconds) == (1, 1, 5.0, 60.0)

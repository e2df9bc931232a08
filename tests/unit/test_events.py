"""Events: one per recorded transition (and per orphan ended, refusal, backend error), posted in the
background, never blocking or breaking the supervisor."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

import dispatch
from dispatch._constants import (
    API_VERSION,
    KIND,
    REASON_BACKEND_ERROR,
    REASON_CANCELLED,
    REASON_FAILED,
    REASON_HELD_OUTSIDE,
    REASON_OBJECT_ENDED,
    REASON_ORPHAN_ENDED,
    REASON_RECOVERING,
    REASON_SUCCEEDED,
    REASON_UNENFORCEABLE,
    REPORTING_CONTROLLER,
)
from dispatch._controller.events import EVENT_REASONS, MAX_PENDING, MAX_SENDING, EventRecorder, event_body
from dispatch._controller.listeners import Fanout
from dispatch._decide import End, Step
from dispatch._model import Record
from tests.support.observe import wait_for

JOB = "team-a/finetune"


def seed_spec(budget: int = 2) -> dispatch.JobSpec:
    return dispatch.JobSpec(
        name="finetune",
        command=("torchrun", "train.py"),
        nodes=2,
        recovery=dispatch.RecoveryPolicy(
            rules=(
                dispatch.Rule(
                    on=(dispatch.CauseKind.PREEMPTED,), action=dispatch.Action.RESUBMIT, budget=budget
                ),
            )
        ),
    )


class Collect:
    """A Post that keeps what it is given."""

    def __init__(self) -> None:
        self.posted: list[tuple[str, dict[str, Any]]] = []

    async def __call__(self, namespace: str, body: dict[str, Any]) -> None:
        self.posted.append((namespace, body))

    def reasons(self) -> list[str]:
        return [b["reason"] for _, b in self.posted]

    def by_reason(self, reason: str) -> dict[str, Any]:
        return next(b for _, b in self.posted if b["reason"] == reason)


async def record_job(
    store: dispatch.MemoryStore, backend: dispatch.MemoryBackend, spec: dispatch.JobSpec
) -> str:
    """Record ``spec`` under the Kubernetes-style id JOB, as the operator would."""
    plan = dispatch.make_plan(JOB, spec, backend.capabilities, supervised=True)
    actor = dispatch.Actor(kind=dispatch.ActorKind.HUMAN, id="ada")
    await store.create(
        Record(
            job=JOB,
            spec=spec,
            plan=plan,
            submitted_by=actor,
            submitted_at=dispatch._supervisor.utcnow(),
            supervised=True,
        )
    )
    return JOB


async def seed_scenario(listener: Any, backend: dispatch.MemoryBackend | None = None) -> dispatch.Status:
    """The seed's tutorial: run, preempt once, recover, complete."""
    memory = dispatch.MemoryBackend(dispatch.Shape.SLURM, auto_run=True)
    store = dispatch.MemoryStore()
    cluster = dispatch.compose(memory, store=store)
    job = await record_job(store, memory, seed_spec())
    supervisor = dispatch.Supervisor(backend or memory, store, listener=listener)
    done = asyncio.create_task(supervisor.run(job))
    status = await wait_for(cluster.observer, job, lambda s: s.state is dispatch.State.RUNNING)
    first = status.submissions[0].canonical
    assert first is not None
    memory.env.preempt(first)
    status = await wait_for(
        cluster.observer, job, lambda s: s.state is dispatch.State.RUNNING and len(s.submissions) == 2
    )
    second = status.submissions[1].canonical
    assert second is not None
    memory.env.complete(second)
    await done
    return await cluster.observer.get(job)


async def test_seed_scenario_posts_an_event_per_transition() -> None:
    post = Collect()
    recorder = EventRecorder(post, instance="op-0")
    status = await seed_scenario(recorder)
    await recorder.drain()

    assert [(t.from_, t.to) for t in status.history] == [
        (dispatch.State.PENDING, dispatch.State.RECOVERING),
        (dispatch.State.RECOVERING, dispatch.State.SUCCEEDED),
    ]
    assert post.reasons() == [REASON_RECOVERING, REASON_SUCCEEDED]
    recovering = post.by_reason(REASON_RECOVERING)
    assert recovering["type"] == "Normal"
    assert recovering["note"] == (
        "submission 1 ended with cause preempted by a higher-priority job; rule 0 "
        "(resubmit on [preempted]) fired, enforced by the supervisor: submission 2 authorized, "
        "budget 1 of 2 left"
    )
    for namespace, body in post.posted:
        assert namespace == "team-a"
        assert body["apiVersion"] == "events.k8s.io/v1"
        assert body["reportingController"] == REPORTING_CONTROLLER == "dispatch.dev/dispatch-operator"
        assert body["reportingInstance"] == "op-0"
        assert body["type"] in ("Normal", "Warning")
        assert re.fullmatch(r"[A-Z][A-Za-z]+", body["reason"])
        assert body["regarding"] == {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "namespace": "team-a",
            "name": "finetune",
        }
        assert body["metadata"]["name"].startswith("finetune.")
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", body["eventTime"])


async def test_failure_event_says_why_no_rule_recovered() -> None:
    memory = dispatch.MemoryBackend(dispatch.Shape.SLURM, auto_run=True)
    store = dispatch.MemoryStore()
    job = await record_job(store, memory, seed_spec(budget=0))
    post = Collect()
    recorder = EventRecorder(post)
    supervisor = dispatch.Supervisor(memory, store, listener=recorder)
    await supervisor.drive(job)
    (obj,) = await memory.list(job)
    memory.env.preempt(obj.id)
    await supervisor.run(job)
    await recorder.drain()
    failed = post.by_reason(REASON_FAILED)
    assert failed["type"] == "Warning"
    assert "rule 0 covers preempted but its budget of 0 is spent" in failed["note"]


async def test_cancel_event_names_who_cancelled() -> None:
    memory = dispatch.MemoryBackend(dispatch.Shape.KUBEFLOW, auto_run=True)
    store = dispatch.MemoryStore()
    cluster = dispatch.compose(memory, store=store)
    job = await record_job(store, memory, seed_spec())
    post = Collect()
    recorder = EventRecorder(post)
    supervisor = dispatch.Supervisor(memory, store, listener=recorder)
    await supervisor.drive(job)
    await cluster.operator.cancel(job, dispatch.Actor(kind=dispatch.ActorKind.HUMAN, id="bob"))
    await supervisor.run(job)
    await recorder.drain()
    assert post.reasons() == [REASON_CANCELLED, REASON_OBJECT_ENDED]
    cancelled = post.by_reason(REASON_CANCELLED)
    assert cancelled["note"] == "job cancelled by human:bob"
    assert "because the job is cancelled" in post.by_reason(REASON_OBJECT_ENDED)["note"]


async def test_orphan_ended_event() -> None:
    memory = dispatch.MemoryBackend(dispatch.Shape.SLURM, auto_run=True)
    store = dispatch.MemoryStore()
    job = await record_job(store, memory, seed_spec())
    post = Collect()
    recorder = EventRecorder(post)
    supervisor = dispatch.Supervisor(memory, store, listener=recorder)
    await supervisor.drive(job)
    record, _ = await store.get(job)
    orphan = await memory.create(job, 1, record.spec, record.plan)  # Slurm numbers jobs: a duplicate
    await supervisor.drive(job)
    await recorder.drain()
    ended = post.by_reason(REASON_ORPHAN_ENDED)
    assert ended["type"] == "Normal"
    assert f"ended object {orphan}" in ended["note"]


def test_refusal_event_names_the_rule() -> None:
    spec = seed_spec().model_copy(
        update={
            "recovery": dispatch.RecoveryPolicy(
                rules=(
                    dispatch.Rule(
                        on=(dispatch.CauseKind.PREEMPTED,), action=dispatch.Action.RESTART, budget=2
                    ),
                )
            )
        }
    )
    with pytest.raises(dispatch.PlanError) as info:
        dispatch.make_plan(
            JOB, spec, dispatch.MemoryBackend(dispatch.Shape.SLURM).capabilities, supervised=True
        )

    async def go() -> Collect:
        post = Collect()
        recorder = EventRecorder(post)
        recorder.refused(JOB, info.value)
        await recorder.drain()
        return post

    post = asyncio.run(go())
    refused = post.by_reason(REASON_UNENFORCEABLE)
    assert refused["type"] == "Warning"
    assert refused["note"].startswith("refused: rule 0 cannot be enforced: only a scheduler can restart")


async def test_posting_never_blocks_and_is_bounded() -> None:
    gate = asyncio.Event()
    calls = 0

    async def stuck(namespace: str, body: dict[str, Any]) -> None:
        nonlocal calls
        calls += 1
        await gate.wait()

    recorder = EventRecorder(stuck, max_pending=2)
    for _ in range(5):
        recorder.emit(JOB, "Normal", REASON_SUCCEEDED, "Test", "x")  # returns at once
    assert recorder.dropped == 3
    gate.set()
    await recorder.drain()
    assert calls == 2


async def test_at_most_max_sending_events_are_posted_at_once() -> None:
    """Each post in flight holds a TLS connection the client keeps while requests keep coming
    (MAX_SENDING's docstring): a burst of Events waits for a sender instead of opening more."""
    gate = asyncio.Event()
    sending = most = 0

    async def slow(namespace: str, body: dict[str, Any]) -> None:
        nonlocal sending, most
        sending += 1
        most = max(most, sending)
        await gate.wait()
        sending -= 1

    recorder = EventRecorder(slow, max_sending=3)
    for _ in range(10):
        recorder.emit(JOB, "Normal", REASON_SUCCEEDED, "Test", "x")
    for _ in range(5):
        await asyncio.sleep(0)
    assert (sending, recorder.dropped) == (3, 0)  # the other seven wait, none dropped
    gate.set()
    await recorder.drain()
    assert (most, recorder.failed) == (3, 0)
    assert MAX_SENDING < MAX_PENDING


async def test_post_errors_are_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    async def broken(namespace: str, body: dict[str, Any]) -> None:
        raise RuntimeError("connection refused")

    recorder = EventRecorder(broken)
    recorder.emit(JOB, "Normal", REASON_SUCCEEDED, "Test", "x")
    await recorder.drain()
    assert recorder.failed == 1
    assert "could not post event Succeeded" in caplog.text


async def test_backend_errors_are_reported_once_in_a_row() -> None:
    post = Collect()
    recorder = EventRecorder(post)
    step: Step = End("7", orphan=True)
    for _ in range(3):
        recorder.errored(
            JOB, step, dispatch.TransientBackendError("slurmrestd: 503 Authorization: Bearer abc.def.ghi")
        )
    await recorder.drain()
    assert post.reasons() == [REASON_BACKEND_ERROR]
    note = post.by_reason(REASON_BACKEND_ERROR)["note"]
    assert "abc.def.ghi" not in note
    assert "[REDACTED]" in note


def test_event_body_rejects_other_types_and_cuts_long_notes() -> None:
    from datetime import UTC, datetime

    now = datetime(2025, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    with pytest.raises(ValueError, match="Normal or Warning"):
        event_body(JOB, None, type="Error", reason="X", action="Y", note="z", instance="i", now=now)
    body = event_body(
        JOB, "uid-1", type="Normal", reason="X", action="Y", note="é" * 2000, instance="i", now=now
    )
    assert len(body["note"].encode()) <= 1024
    assert body["regarding"]["uid"] == "uid-1"
    assert body["eventTime"] == "2025-01-02T03:04:05.678901Z"


async def test_every_event_lost_is_counted_by_reason_in_the_metric() -> None:
    """Events may be dropped under load, never silently: too many pending, or the API refused."""
    from dispatch._controller.metrics import Metrics

    metrics = Metrics()
    gate = asyncio.Event()

    async def stuck(namespace: str, body: dict[str, Any]) -> None:
        await gate.wait()

    recorder = EventRecorder(stuck, max_pending=1, on_dropped=metrics.event_dropped)
    recorder.emit(JOB, "Normal", REASON_RECOVERING, "Resubmit", "posted")
    recorder.emit(JOB, "Normal", REASON_RECOVERING, "Resubmit", "dropped")
    recorder.emit(JOB, "Warning", REASON_FAILED, "Fail", "dropped")
    recorder.emit(JOB, "Normal", "NoSuchReason", "Test", "dropped")
    gate.set()
    await recorder.drain()

    async def refused(namespace: str, body: dict[str, Any]) -> None:
        raise RuntimeError("403 Forbidden")

    refusing = EventRecorder(refused, on_dropped=metrics.event_dropped)
    refusing.emit(JOB, "Normal", REASON_SUCCEEDED, "Succeed", "refused")
    await refusing.drain()

    def dropped(reason: str) -> float | None:
        return metrics.registry.get_sample_value("dispatch_events_dropped_total", {"reason": reason})

    assert (recorder.dropped, refusing.failed) == (3, 1)
    assert dropped(REASON_RECOVERING) == 1
    assert dropped(REASON_FAILED) == 1
    assert dropped(REASON_SUCCEEDED) == 1
    assert dropped("other") == 1  # a bounded label: an unknown reason is not a new series


async def test_a_hold_outside_dispatch_is_a_warning_naming_the_holder() -> None:
    post = Collect()
    recorder = EventRecorder(post)
    recorder.remember(JOB, "uid-1")
    note = "suspended by kueue-admission at 2026-12-01T10:00:00Z; dispatch leaves it so"
    Fanout([object(), recorder]).held(JOB, note)  # type: ignore[list-item]  # a listener without held
    await recorder.drain()
    held = post.by_reason(REASON_HELD_OUTSIDE)
    assert held["type"] == "Warning"
    assert held["note"] == note
    assert REASON_HELD_OUTSIDE in EVENT_REASONS  # its drops are counted under its own reason


async def test_events_wait_while_recoveries_do_and_trickle_out_meanwhile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Recoveries before Events even without a write limit: while recoveries wait for a worker,
    queued Events are held (one posted per HELD_INTERVAL, so none stalls), none is dropped, and
    each keeps the time it happened, not the time it was posted."""
    from datetime import UTC, datetime, timedelta

    from dispatch._controller import events as events_module

    monkeypatch.setattr(events_module, "HELD_INTERVAL", 0.2)
    monkeypatch.setattr(events_module, "HELD_POLL", 0.01)
    post = Collect()
    start = datetime(2026, 12, 6, 4, 0, tzinfo=UTC)
    ticks = iter(range(100))
    recorder = EventRecorder(post, max_pending=10, clock=lambda: start + timedelta(seconds=next(ticks)))
    recovering = True
    recorder.hold_while(lambda: recovering)
    loop = asyncio.get_running_loop()
    began = loop.time()
    for i in range(10):
        recorder.emit(JOB, "Normal", REASON_RECOVERING, "Resubmit", f"recovery {i}")
    await asyncio.sleep(0.5)
    trickled = len(post.posted)
    elapsed = loop.time() - began
    assert 1 <= trickled <= 2 + elapsed / 0.2  # the first at once, then one per interval
    assert recorder.pending == 10 - trickled
    recovering = False
    await recorder.drain()
    notes = [body["note"] for _, body in post.posted]
    assert notes == [f"recovery {i}" for i in range(10)]  # all of them, in order
    assert (recorder.dropped, recorder.failed, recorder.pending) == (0, 0, 0)
    assert post.posted[9][1]["eventTime"] == "2026-12-06T04:00:09.000000Z"


async def test_an_event_queued_as_the_last_sender_finishes_is_still_posted() -> None:
    """The sender leaves at once when it finds nothing queued, not in its done callback: an Event
    queued in between would otherwise wait for the next Event to be posted."""
    post = Collect()
    recorder: EventRecorder

    async def first(namespace: str, body: dict[str, Any]) -> None:
        await post(namespace, body)
        if len(post.posted) == 1:  # runs after this sender's last look, before its done callback
            asyncio.get_running_loop().call_soon(
                recorder.emit, JOB, "Normal", REASON_SUCCEEDED, "Succeed", "second"
            )

    recorder = EventRecorder(first)
    recorder.emit(JOB, "Normal", REASON_RECOVERING, "Resubmit", "first")
    await recorder.drain()
    assert [body["note"] for _, body in post.posted] == ["first", "second"]


async def test_the_operator_stopping_posts_held_events_and_counts_what_it_cannot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dispatch._controller import events as events_module

    monkeypatch.setattr(events_module, "HELD_INTERVAL", 3600.0)
    monkeypatch.setattr(events_module, "HELD_POLL", 0.01)
    post = Collect()
    recorder = EventRecorder(post)
    recorder.hold_while(lambda: True)  # recoveries waiting for ever: only the first trickles out
    for i in range(3):
        recorder.emit(JOB, "Normal", REASON_RECOVERING, "Resubmit", f"recovery {i}")
    await recorder.aclose()  # held no more
    assert (len(post.posted), recorder.dropped) == (3, 0)

    gate = asyncio.Event()

    async def stuck(namespace: str, body: dict[str, Any]) -> None:
        await gate.wait()

    stuck_recorder = EventRecorder(stuck, max_sending=1)
    for i in range(3):
        stuck_recorder.emit(JOB, "Normal", REASON_RECOVERING, "Resubmit", f"recovery {i}")
    await stuck_recorder.aclose(grace=0.1)
    assert (stuck_recorder.dropped, stuck_recorder.pending) == (3, 0)  # one cut off sending, two queued

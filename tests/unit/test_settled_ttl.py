"""A settled job's time to live: when it settled (in the record, from the settle write itself), when it
expires, and the loop's turn that waits for it or exports the final record and deletes the job."""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatch import JobSpec, MemoryBackend, Record, Shape, State
from dispatch._controller.crd import spec_schema
from dispatch._controller.logs import JsonFormatter
from dispatch._controller.loop import SupervisionLoop
from dispatch._controller.runtime import Runtime
from dispatch._controller.store import JobView, view_of
from dispatch._controller.webhook import Refused, check
from dispatch._decide import reopening
from dispatch._dispatchjob import expired_note, expires_at, final_summary, record_from, settled_time
from dispatch._errors import VersionConflict
from dispatch._protocols import Versioned
from dispatch._supervisor import Turn
from tests.support.builders import dispatch_job
from tests.support.records import at
from tests.support.records import dispatch_job as job_body
from tests.support.supervised import succeeded

T0 = datetime(2026, 1, 1, tzinfo=UTC)


async def settled_record(**spec: Any) -> tuple[Any, Record, str]:
    """A job run to success on the memory backend: its cluster, settled record and version."""
    cluster, job = await succeeded(
        MemoryBackend(Shape.SLURM, auto_run=True), JobSpec(name="done", command=("train",), **spec)
    )
    record, version = await cluster.store.get(job)
    return cluster, record, version


async def test_the_settle_write_records_when_the_job_settled() -> None:
    _, record, _ = await settled_record()
    assert record.settled
    assert record.settled_at is not None
    assert record.settled_at >= record.history[-1].time  # the outcome comes first, then the settle
    assert settled_time(record) == record.settled_at


def _at(record: Record, *, settled: bool, settled_at: datetime | None) -> Record:
    return record.model_copy(update={"settled": settled, "settled_at": settled_at})


@given(ttl=st.integers(min_value=0, max_value=10**8), offset=st.integers(min_value=0, max_value=10**8))
def test_a_job_expires_its_ttl_after_it_settled_and_never_while_live(ttl: int, offset: int) -> None:
    record = _BASE
    at = T0 + timedelta(seconds=offset)
    settled = _at(record, settled=True, settled_at=at)
    assert expires_at(settled, ttl) == at + timedelta(seconds=ttl)
    assert expires_at(settled, None) is None  # no time to live: kept
    assert expires_at(_at(record, settled=False, settled_at=None), ttl) is None


def test_a_record_settled_before_the_settle_time_was_kept_counts_from_its_outcome() -> None:
    legacy = _at(_BASE, settled=True, settled_at=None)
    assert legacy.history
    assert settled_time(legacy) == legacy.history[-1].time


@pytest.fixture(scope="module", autouse=True)
def _base() -> None:
    global _BASE
    _, _BASE, _ = asyncio.run(settled_record())


_BASE: Record


class Store:
    """The store's part a settled job's turn uses: its clock, the record read whole, a deletion."""

    def __init__(self, now: datetime, record: Record, stale: bool = False) -> None:
        self.now = now
        self.stored = record
        self.stale = stale
        self.reads = 0
        self.deleted: list[tuple[str, str]] = []

    def clock(self) -> datetime:
        return self.now

    async def get(self, job: str) -> Versioned:
        self.reads += 1
        return Versioned(self.stored, "7")

    async def delete(self, job: str, expected: str) -> None:
        if self.stale:
            raise VersionConflict(job, expected)
        self.deleted.append((job, expected))


class Events:
    def __init__(self) -> None:
        self.expired_notes: list[tuple[str, str]] = []

    def expired(self, job: str, note: str) -> None:
        self.expired_notes.append((job, note))


def loop_of(store: Store, settled_ttl: int | None = None) -> tuple[SupervisionLoop, Events]:
    events = Events()
    runtime = Runtime(
        store=cast(Any, store),
        backends={"memory": MemoryBackend()},
        events=cast(Any, events),
        settled_ttl=settled_ttl,
    )
    return SupervisionLoop(runtime), events


def with_ttl(record: Record, ttl: int | None) -> Record:
    return record.model_copy(
        update={"spec": record.spec.model_copy(update={"ttl_seconds_after_settled": ttl})}
    )


def view(record: Record) -> JobView:
    """The slim view the store keeps of ``record``'s DispatchJob at version 7, as the watch shows it."""
    body = at(job_body(record), 7)
    if record.spec.ttl_seconds_after_settled is not None:
        body["spec"]["ttlSecondsAfterSettled"] = record.spec.ttl_seconds_after_settled
    return view_of(body)


def test_a_settled_jobs_view_keeps_when_it_settled_and_no_record() -> None:
    slim = view(with_ttl(_BASE, 60))
    assert slim.slim
    assert (slim.settled_at, slim.ttl, slim.state) == (_BASE.settled_at, 60, "succeeded")
    assert slim.text is None
    assert not slim.packed_conditions
    assert not slim.observed
    assert not slim.uid
    whole = view_of(at(job_body(_BASE), 7), slim=False)
    assert not whole.slim
    assert whole.text is not None
    assert whole.settled_at == _BASE.settled_at
    retried = at(job_body(_BASE.model_copy(update={"state": State.FAILED})), 7)
    retried["spec"]["retry"] = {"count": 1}
    assert view_of(retried).settled_at is None  # a person's retry reopens it: supervised whole


async def test_a_settled_job_whose_ttl_runs_waits_on_one_timer_set_from_the_record() -> None:
    record = with_ttl(_BASE, 60)
    assert record.settled_at is not None
    for elapsed in (0, 45):  # a restarted operator sets the timer from the record: what is left
        store = Store(record.settled_at + timedelta(seconds=elapsed), record)
        loop, events = loop_of(store)
        loop.queue.pending[record.job] = None
        assert await loop._settled(record.job, view(record), "memory") is Turn.WAIT
        timer = loop.queue.timers[record.job]
        left = timer.when() - asyncio.get_running_loop().time()
        assert 60 - elapsed - 1 < left <= 60 - elapsed
        assert not events.expired_notes
        assert store.reads == 0  # decided from the view
        loop.queue.wake_at(record.job, None)


async def test_a_settled_job_without_a_ttl_leaves_the_queue() -> None:
    store = Store(T0 + timedelta(days=365 * 10), _BASE)
    loop, _ = loop_of(store)
    loop.queue.pending[_BASE.job] = None
    assert await loop._settled(_BASE.job, view(with_ttl(_BASE, None)), "memory") is Turn.DONE
    assert not loop.queue.timers
    assert not store.deleted
    assert store.reads == 0


async def test_an_expired_job_is_exported_then_deleted_at_the_version_read(
    caplog: pytest.LogCaptureFixture,
) -> None:
    record = with_ttl(_BASE, 5)
    assert record.settled_at is not None
    store = Store(record.settled_at + timedelta(seconds=5), record)
    loop, events = loop_of(store, settled_ttl=3600)  # the job's own time to live wins
    with caplog.at_level(logging.INFO, logger="dispatch.operator"):
        assert await loop._settled(record.job, view(record), "memory") is Turn.WAIT
    assert store.deleted == [(record.job, "7")]
    [(job, note)] = events.expired_notes
    assert job == record.job
    assert "succeeded in submission 1" in note
    [line] = [r for r in caplog.records if "expired" in r.getMessage()]
    exported = json.loads(JsonFormatter().format(line))
    assert exported["job"] == record.job
    assert exported["record"] == final_summary(record)
    assert exported["record"]["state"] == "succeeded"
    assert exported["record"]["settledAt"] == record.settled_at.strftime("%Y-%m-%dT%H:%M:%SZ")


async def test_the_operators_default_ttl_applies_to_a_job_without_one() -> None:
    record = with_ttl(_BASE, None)
    assert record.settled_at is not None
    store = Store(record.settled_at + timedelta(seconds=31), record)
    loop, _ = loop_of(store, settled_ttl=30)
    assert await loop._settled(record.job, view(record), "memory") is Turn.WAIT
    assert store.deleted == [(record.job, "7")]


async def test_a_ttl_made_longer_since_the_view_is_not_deleted_on_the_view() -> None:
    record = with_ttl(_BASE, 5)
    assert record.settled_at is not None
    store = Store(record.settled_at + timedelta(seconds=6), with_ttl(_BASE, 3600))
    loop, events = loop_of(store)
    assert await loop._settled(record.job, view(record), "memory") is Turn.AGAIN
    assert not store.deleted
    assert not events.expired_notes


async def test_a_job_changed_since_its_turn_read_it_is_not_deleted() -> None:
    record = with_ttl(_BASE, 0)
    assert record.settled_at is not None
    loop, _ = loop_of(Store(record.settled_at, record, stale=True))
    with pytest.raises(VersionConflict):  # the queue takes it as AGAIN: the next turn decides anew
        await loop._settled(record.job, view(record), "memory")


def test_the_note_says_how_the_job_ended_and_when() -> None:
    note = expired_note(final_summary(_BASE))
    assert "succeeded in submission 1" in note
    assert "by human:ada" in note


def test_the_ttl_may_change_after_creation_and_the_rest_of_the_spec_may_not() -> None:
    old = dispatch_job("train", backend="slurm", ttlSecondsAfterSettled=60)
    check(dispatch_job("train", backend="slurm", ttlSecondsAfterSettled=5), old, "UPDATE")
    check(dispatch_job("train", backend="slurm"), old, "UPDATE")
    with pytest.raises(Refused, match="spec is fixed"):
        check(dispatch_job("train", backend="slurm", ttlSecondsAfterSettled=60, nodes=2), old, "UPDATE")
    rules = [v["rule"] for v in spec_schema()["x-kubernetes-validations"]]
    assert not any("ttlSecondsAfterSettled" in rule for rule in rules)
    assert any("self.nodes == oldSelf.nodes" in rule for rule in rules)
    assert spec_schema()["properties"]["ttlSecondsAfterSettled"]["minimum"] == 0


@given(
    state=st.sampled_from([State.SUCCEEDED, State.FAILED, State.CANCELLED]),
    is_settled=st.booleans(),
    kept_time=st.booleans(),
    asked=st.integers(min_value=0, max_value=2),
    taken=st.integers(min_value=0, max_value=2),
)
def test_the_view_says_settled_exactly_when_the_record_is_settled_and_not_reopened(
    state: State, is_settled: bool, kept_time: bool, asked: int, taken: int
) -> None:
    """What the loop decides from the view without parsing the record agrees with the record."""
    record = _BASE.model_copy(
        update={
            "state": state,
            "settled": is_settled,
            "settled_at": _BASE.settled_at if kept_time else None,
            "retries": taken,
        }
    )
    body = at(job_body(record), 7)
    if asked:
        body["spec"]["retry"] = {"count": asked}
    parsed = record_from(body)
    expected = settled_time(parsed) if parsed.settled and not reopening(parsed) else None
    assert view_of(body).settled_at == expected
    assert view_of(body).slim is (expected is not None)

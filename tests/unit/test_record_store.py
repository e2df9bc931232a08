"""The record store's cache keeps a projection of each DispatchJob, never its whole body once it
holds a record (the record's part of it as one JSON text), and parses a version's record once while
it is among the last few parsed.

No API server here: the store is fed through its shared watch's entry point (``_dispatch``), as the
watch feeds it, and every answer below comes from the cache (the client points at a closed port,
so a GET would fail). Compare-and-swap against a real API server (a stale view still gets
VersionConflict, an observe write keeps the status) is tests/integration/test_record_store.py.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient, Configuration

from dispatch._constants import COND_STALLED, FINALIZER, REASON_UNENFORCEABLE
from dispatch._controller.store import PARSED, KubeRecordStore, view_of
from dispatch._decide import Authorize
from dispatch._dispatchjob import OBSERVED_FIELDS, record_from
from dispatch._errors import JobNotFound
from dispatch._model import Record
from tests.support.records import AUTHORIZED, FAILED, PENDING, RECOVERING, at, dispatch_job, step

JOB = "team-a/finetune"


@pytest.fixture
async def store() -> AsyncIterator[KubeRecordStore]:
    async with ApiClient(Configuration(host="https://127.0.0.1:9")) as api:
        store = KubeRecordStore(api, namespaces=["team-a"])
        store._listeners.append(lambda job, body: None)  # as watch_all does, without the watch
        yield store


def show(store: KubeRecordStore, body: dict[str, Any], kind: str = "MODIFIED") -> None:
    """``body`` as the shared watch hands it on (``kind`` DELETED: deleted)."""
    store._dispatch(body, deleted=kind == "DELETED")


def test_a_view_keeps_what_the_loop_and_the_writes_need() -> None:
    record = step(PENDING, Authorize(submission=1))
    view = view_of(at(dispatch_job(record, generation=2), 7, deletionTimestamp="2026-12-01T00:00:00Z"))
    assert (view.version, view.generation, view.uid) == ("7", 2, "uid-1")
    assert (view.finalizers, view.deleting, view.backend) == ((FINALIZER,), True, "kubeflow")
    assert view.recorded
    assert (view.refusal, view.observed_generation) == (None, 2)
    body = dispatch_job(record, generation=2)
    assert view.conditions() == body["status"]["conditions"]
    assert view.body is None  # the record's part of it is kept as text, parsed on the first get()
    assert view.text is not None
    kept = view.text.body()
    assert set(kept["metadata"]) <= {"name", "namespace", "labels", "annotations"}
    assert kept["spec"] == at(body, 7)["spec"]
    assert "conditions" not in kept["status"]
    assert not set(OBSERVED_FIELDS) & set(kept["status"])

    refused = view_of(at(dispatch_job(None, refused=(REASON_UNENFORCEABLE, "rules[0]: no")), 8))
    assert not refused.recorded
    assert refused.refusal == REASON_UNENFORCEABLE
    assert any(c["type"] == COND_STALLED for c in refused.conditions())


async def test_get_parses_a_version_once_and_keeps_no_body(store: KubeRecordStore) -> None:
    record = step(PENDING, Authorize(submission=1))
    body = at(dispatch_job(record), 5)
    show(store, body, "ADDED")
    first = await store.get(JOB)
    again = await store.get(JOB)
    assert first.version == again.version == "5"
    assert again.record is first.record
    assert first.record == record_from(body)
    assert store.parses == 1
    view = await store.view(JOB)
    assert view.body is None

    show(store, body)  # the same version again (a relist): nothing to parse
    await store.get(JOB)
    assert store.parses == 1
    show(store, at(dispatch_job(record), 6))  # a new version is parsed, once
    assert (await store.get(JOB)).version == "6"
    await store.get(JOB)
    assert store.parses == 2


async def test_only_the_last_records_parsed_are_kept_parsed(store: KubeRecordStore) -> None:
    """Past :data:`PARSED` other jobs, a job's record is parsed again from its text: equal, not kept."""
    record = step(PENDING, Authorize(submission=1))
    body = at(dispatch_job(record), 5)
    show(store, body, "ADDED")
    first = (await store.get(JOB)).record
    for i in range(PARSED):
        other = copy.deepcopy(body)
        other["metadata"]["name"] = f"other-{i}"
        show(store, other, "ADDED")
        await store.get(f"team-a/other-{i}")
    assert store.parses == PARSED + 1
    assert len(store._parsed) == PARSED
    again = (await store.get(JOB)).record
    assert store.parses == PARSED + 2
    assert again == first
    assert again is not first


@pytest.mark.parametrize("record", [PENDING, RECOVERING, FAILED], ids=["pending", "recovering", "failed"])
async def test_a_record_parsed_from_the_text_is_the_bodys(
    store: KubeRecordStore, record: Record, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = at(dispatch_job(record), 3, managedFields=copy.deepcopy(MANAGED), labels={"team": "a"})
    body["metadata"]["annotations"] = {"dispatch.dev/submitted-by": "human:alice"}
    reads: list[str] = []

    async def get(namespace: str, name: str) -> dict[str, Any]:
        reads.append(name)
        return copy.deepcopy(body)

    monkeypatch.setattr(store.objects, "get", get)
    show(store, body, "ADDED")
    assert (await store.get(JOB)).record == record_from(body)
    # A settled job's view keeps no record (most of a cluster's jobs): it is read whole when asked.
    assert reads == (["finetune"] if record.settled else [])
    assert (await store.view(JOB)).slim is False


async def test_an_older_event_does_not_replace_a_newer_view(store: KubeRecordStore) -> None:
    record = step(PENDING, Authorize(submission=1))
    newer = at(dispatch_job(record), 9)
    show(store, newer, "ADDED")
    show(store, at(dispatch_job(PENDING), 8))  # the watch lags behind
    assert (await store.get(JOB)) == (record_from(newer), "9")


async def test_a_job_without_a_record_keeps_its_body_for_planning(store: KubeRecordStore) -> None:
    body = at(dispatch_job(None), 3)
    show(store, body, "ADDED")
    view = await store.view(JOB)
    assert not view.recorded
    assert view.body == body
    with pytest.raises(JobNotFound):
        await store.get(JOB)


async def test_a_deleted_job_is_forgotten(store: KubeRecordStore) -> None:
    body = at(dispatch_job(PENDING), 4)
    show(store, body, "ADDED")
    await store.get(JOB)
    show(store, body, "DELETED")
    assert JOB not in store._views
    assert JOB not in store._fresh


async def test_the_owner_reference_comes_from_the_view_without_a_get(store: KubeRecordStore) -> None:
    show(store, at(dispatch_job(PENDING), 4), "ADDED")
    owner = await store.owner_reference(store.api, "team-a", "finetune")  # no GET: the port is closed
    assert owner == {
        "apiVersion": "dispatch.dev/v1alpha1",
        "kind": "DispatchJob",
        "name": "finetune",
        "uid": "uid-1",
        "controller": True,
    }


MANAGED = [
    {"manager": "kubectl", "operation": "Apply", "time": "2026-12-01T10:00:00Z", "fieldsV1": {"f:spec": {}}},
    {
        "manager": "dispatch-operator",
        "operation": "Update",
        "subresource": "status",
        "time": "2026-12-01T10:00:01Z",
        "fieldsV1": {"f:status": {"f:plan": {}, "f:submissions": {}}},
    },
]


async def test_a_view_keeps_no_managed_fields_and_its_record_is_the_same(store: KubeRecordStore) -> None:
    body = at(dispatch_job(PENDING), 4, managedFields=copy.deepcopy(MANAGED))
    view = view_of(body)
    assert view.text is not None
    assert "managedFields" not in view.text.body()["metadata"]
    assert body["metadata"]["managedFields"] == MANAGED  # the event's body is left as it came
    show(store, body, "ADDED")
    assert (await store.get(JOB)).record == record_from(body)

    unplanned = view_of(at(dispatch_job(None), 5, managedFields=copy.deepcopy(MANAGED)))
    assert unplanned.body is not None
    assert "managedFields" not in unplanned.body["metadata"]


async def test_a_cancelled_job_keeps_the_managed_fields_its_cancel_time_comes_from(
    store: KubeRecordStore,
) -> None:
    cancelled = {"manager": "kubectl", "operation": "Update", "time": "2026-12-01T11:30:00Z"}
    managed = [*copy.deepcopy(MANAGED), {**cancelled, "fieldsV1": {"f:spec": {"f:cancel": {}}}}]
    body = at(dispatch_job(PENDING), 5, managedFields=managed)
    body["spec"]["cancel"] = True
    view = view_of(body)
    assert view.text is not None
    assert "managedFields" not in view.text.body()["metadata"]  # the cancel time is read once, here
    assert view.cancelled_at is not None
    assert view.cancelled_at.isoformat().startswith("2026-12-01T11:30:00")
    show(store, body, "ADDED")
    record = (await store.get(JOB)).record
    assert record.cancel is not None
    assert record.cancel.time == record_from(body).cancel.time  # type: ignore[union-attr]
    assert record.cancel.time.isoformat().startswith("2026-12-01T11:30:00")


async def test_a_cancel_time_from_the_clock_is_the_same_at_every_parse(store: KubeRecordStore) -> None:
    """Without a managedFields entry for spec.cancel, its time is when the version was seen: read
    once, so a record parsed again (after :data:`PARSED` others) says the same."""
    ticks = iter(datetime(2026, 12, 1, 12, minute, tzinfo=UTC) for minute in range(60))
    store.clock = lambda: next(ticks)
    body = at(dispatch_job(PENDING), 6)
    body["spec"]["cancel"] = True
    show(store, body, "ADDED")
    first = (await store.get(JOB)).record
    store._parsed.clear()
    again = (await store.get(JOB)).record
    assert first.cancel is not None
    assert again.cancel is not None
    assert again.cancel.time == first.cancel.time == datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


async def test_a_record_write_carries_the_observed_fields_it_is_given(
    store: KubeRecordStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``put``'s ``observed``: the fields the decision that made the write shows; without them, those
    of the version written over (the PUT replaces the status); once settled, the outcome's."""
    body = at(dispatch_job(AUTHORIZED), 5)
    body["status"]["observedState"] = "running"
    show(store, body, "ADDED")
    written: list[dict[str, Any]] = []

    async def replace_status(namespace: str, name: str, new: dict[str, Any]) -> dict[str, Any]:
        written.append(new["status"])
        served = at(dispatch_job(AUTHORIZED), 5 + len(written))
        served["status"] = new["status"]
        return served

    monkeypatch.setattr(store.objects, "replace_status", replace_status)

    def observed(status: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in status.items() if k in OBSERVED_FIELDS}

    assert await store.put(RECOVERING, "5") == "6"
    assert observed(written[-1]) == {"observedState": "running"}
    shows = {"observedState": "recovering", "observedCause": "preempted"}
    assert await store.put(RECOVERING, "6", shows) == "7"
    assert observed(written[-1]) == shows
    await store.put(FAILED, "7", {"observedState": "running"})
    assert observed(written[-1]) == {"observedState": "failed", "observedCause": "out-of-memory"}

"""The record store's cache keeps a projection of each DispatchJob, never its whole body once the
record is parsed, and parses a version's record once (issue 13, "slim caches").

No API server here: the store is fed through its shared watch's entry point (``_dispatch``), as the
watch feeds it, and every answer below comes from the cache (the client points at a closed port,
so a GET would fail). Compare-and-swap against a real API server (a stale view still gets
VersionConflict, an observe write keeps the status) is tests/integration/test_kube_store.py.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient, Configuration
from pydantic import BaseModel

from dispatch._api import record_from
from dispatch._constants import COND_STALLED, FINALIZER, REASON_UNENFORCEABLE
from dispatch._decide import Authorize
from dispatch._errors import JobNotFound
from dispatch._kube.store import _SHARED_MODELS, KubeRecordStore, compact, view_of
from dispatch._kubeclient import WatchEvent
from dispatch._model import Cause, Record
from tests.unit.test_argocd_health import FAILED, PENDING, RECOVERING, dispatch_job, step

JOB = "team-a/finetune"


def at(body: dict[str, Any], version: int, **meta: Any) -> dict[str, Any]:
    """``body`` as the API server serves it at resourceVersion ``version``."""
    shown = copy.deepcopy(body)
    shown["spec"]["kubeflow"] = {"image": "pytorch/pytorch:2.4"}
    shown["metadata"].update(resourceVersion=str(version), uid="uid-1", finalizers=[FINALIZER], **meta)
    return shown


@pytest.fixture
async def store() -> AsyncIterator[KubeRecordStore]:
    async with ApiClient(Configuration(host="https://127.0.0.1:9")) as api:
        store = KubeRecordStore(api, namespaces=["team-a"])
        store._listeners.append(lambda kind, job, body: None)  # as watch_all does, without the watch
        yield store


def show(store: KubeRecordStore, body: dict[str, Any], kind: str = "MODIFIED") -> None:
    store._dispatch(WatchEvent(kind, body))


def test_a_view_keeps_what_the_loop_and_the_writes_need() -> None:
    record = step(PENDING, Authorize(submission=1))
    view = view_of(at(dispatch_job(record, generation=2), 7, deletionTimestamp="2026-12-01T00:00:00Z"))
    assert (view.version, view.generation, view.uid) == ("7", 2, "uid-1")
    assert (view.finalizers, view.deleting, view.backend) == ((FINALIZER,), True, "kubeflow")
    assert view.recorded
    assert (view.refusal, view.observed_generation) == (None, 2)
    assert view.conditions() == dispatch_job(record, generation=2)["status"]["conditions"]
    assert view.record is None  # parsed on the first get()
    assert view.body is not None

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
    assert view.record is first.record

    show(store, body)  # the same version again (a relist): nothing to parse
    await store.get(JOB)
    assert store.parses == 1
    show(store, at(dispatch_job(record), 6))  # a new version is parsed, once
    assert (await store.get(JOB)).version == "6"
    await store.get(JOB)
    assert store.parses == 2


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
    assert view.body is not None
    assert "managedFields" not in view.body["metadata"]
    assert body["metadata"]["managedFields"] == MANAGED  # the event's body is left as it came
    show(store, body, "ADDED")
    assert (await store.get(JOB)).record == record_from(body)


async def test_a_cancelled_job_keeps_the_managed_fields_its_cancel_time_comes_from(
    store: KubeRecordStore,
) -> None:
    cancelled = {"manager": "kubectl", "operation": "Update", "time": "2026-12-01T11:30:00Z"}
    managed = [*copy.deepcopy(MANAGED), {**cancelled, "fieldsV1": {"f:spec": {"f:cancel": {}}}}]
    body = at(dispatch_job(PENDING), 5, managedFields=managed)
    body["spec"]["cancel"] = True
    view = view_of(body)
    assert view.body is not None
    assert view.body["metadata"]["managedFields"] == managed
    show(store, body, "ADDED")
    record = (await store.get(JOB)).record
    assert record.cancel is not None
    assert record.cancel.time == record_from(body).cancel.time  # type: ignore[union-attr]
    assert record.cancel.time.isoformat().startswith("2026-12-01T11:30:00")


def _models_of(value: Any) -> list[BaseModel]:
    """Every model instance inside ``value``, depth first."""
    found: list[BaseModel] = []
    if isinstance(value, BaseModel):
        found.append(value)
        for part in value.__dict__.values():
            found.extend(_models_of(part))
    elif isinstance(value, tuple):
        for part in value:
            found.extend(_models_of(part))
    return found


@pytest.mark.parametrize("record", [PENDING, RECOVERING, FAILED], ids=["pending", "recovering", "failed"])
def test_compact_shares_what_records_repeat_and_changes_nothing_readable(record: Record) -> None:
    """Two records parsed from equal bodies, compacted as the store does: equal to what pydantic
    parsed, and every shared model, fields set and short string is one object between them, except
    a Cause with detail (the scheduler's words differ per job). Runs each record twice through, so a
    model taken whole from the weak table (its parts not walked) is checked like a walked one."""
    body = at(dispatch_job(record), 1)
    first, second = (compact(record_from(body)) for _ in range(2))
    assert first == second == record_from(body)
    assert first is not second
    pairs = list(zip(_models_of(first), _models_of(second), strict=True))
    assert pairs
    for a, b in pairs:
        assert type(a) is type(b)
        assert a.__pydantic_fields_set__ is b.__pydantic_fields_set__
        if isinstance(a, _SHARED_MODELS) and not (isinstance(a, Cause) and a.detail):
            assert a is b, type(a).__name__
        elif isinstance(a, Record):
            assert a is not b
        for name, value in a.__dict__.items():
            if type(value) is str and len(value) <= 64:
                assert value is b.__dict__[name], name


def test_compact_keeps_a_cause_with_detail_per_record() -> None:
    body = at(dispatch_job(RECOVERING), 1)
    first, second = (compact(record_from(body)) for _ in range(2))
    causes = [
        (a, b) for a, b in zip(_models_of(first), _models_of(second), strict=True) if isinstance(a, Cause)
    ]
    assert any(a.detail for a, _ in causes)
    for a, b in causes:
        assert (a is b) is not bool(a.detail)


def test_compact_takes_a_known_model_only_when_equal(monkeypatch: pytest.MonkeyPatch) -> None:
    """The weak table is keyed by hash: a different model under the same key (a collision) is
    never put in a record's place."""
    import dispatch._kube.store as store_module

    record = record_from(at(dispatch_job(RECOVERING), 1))
    resources = record.spec.kubeflow.resources if record.spec.kubeflow is not None else None
    assert resources is not None
    impostor = resources.model_copy(update={"cpu": "999"})
    table: weakref.WeakValueDictionary[int, BaseModel] = weakref.WeakValueDictionary()
    table[hash(resources)] = impostor
    monkeypatch.setattr(store_module, "_models", table)
    compacted = compact(record)
    assert compacted.spec.kubeflow is not None
    assert compacted.spec.kubeflow.resources == resources
    assert compacted.spec.kubeflow.resources is not impostor

"""The record store against the real API server: its slim cache keeps compare-and-swap as it was.

The store keeps a projection of each version (tests/unit/test_record_store.py), and the record it
wrote instead of parsing its own write again. Here: a view that the API server has moved past still
gets VersionConflict on put and on observe (the 409 of the PUT), and an observe write, whose status
is rebuilt from the parsed record rather than from a kept body, leaves the rest of the status
exactly as the API server had it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient

from dispatch._backends.kubeflow._adapter import CAPABILITIES
from dispatch._constants import STATUS_OBSERVED_NOTE
from dispatch._controller.store import KubeRecordStore
from dispatch._dispatchjob import job_spec, new_record
from dispatch._errors import VersionConflict
from dispatch._kubeclient import _objects
from dispatch._model import NO_CAUSE, State
from dispatch._plan import make_plan
from tests.integration.conftest import apply, dispatch_job, get_job
from tests.support.kube import KubeCluster

pytestmark = pytest.mark.integration


def without_observed(status: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in status.items() if not k.startswith("observed") or k == "observedGeneration"}


async def test_a_stale_view_still_conflicts_and_observe_keeps_the_status(
    crds: KubeCluster, namespace: str, api: ApiClient
) -> None:
    apply(crds, namespace, dispatch_job("slim"))
    job = f"{namespace}/slim"
    store = KubeRecordStore(api, namespaces=[namespace])
    body = await store.read(job)
    spec = job_spec(body)
    record = new_record(body, spec, make_plan(job, spec, CAPABILITIES, supervised=True))
    written = await store.create(record)
    assert store.parses == 0  # the record written is the new version's record: nothing to parse
    view = store._views[job]  # no watch here: view() would read again
    assert view.version == written
    assert view.body is None

    # Another writer moves the object on; this store does not watch, so its view stays behind.
    patch = json.dumps({"status": {STATUS_OBSERVED_NOTE: "someone else"}})
    crds.kubectl(
        "patch", "dispatchjob", "slim", "-n", namespace, "--subresource=status", "--type=merge", "-p", patch
    )
    with pytest.raises(VersionConflict):
        await store.observe(job, State.PENDING, NO_CAUSE, written)
    assert store.parses == 0
    # put finds its view dropped by that 409, reads the object again and gets the 409's answer.
    with pytest.raises(VersionConflict):
        await store.put(record, written)
    store._views[job] = view  # the view from before the other writer, as a lagging cache has it
    with pytest.raises(VersionConflict):
        await store.put(record, written)

    current = await store.get(job)  # read again: that version is parsed, once
    assert current.record == record
    assert store.parses == 1
    before = get_job(crds, namespace, "slim")["status"]
    after_write = await store.observe(job, State.PENDING, NO_CAUSE, current.version, note="held by a test")
    assert after_write is not None
    assert store.parses == 1
    after = get_job(crds, namespace, "slim")["status"]
    assert after[STATUS_OBSERVED_NOTE] == "held by a test"
    # The record is kept; the conditions say the same, their messages now with why the job waits.
    conditions_before, conditions_after = before.pop("conditions"), after.pop("conditions")
    assert without_observed(after) == without_observed(before)
    assert [(c["type"], c["status"], c["reason"]) for c in conditions_after] == [
        (c["type"], c["status"], c["reason"]) for c in conditions_before
    ]
    for old, new in zip(conditions_before, conditions_after, strict=True):
        assert new["message"] in (old["message"], f"{old['message']}; held by a test"), new


async def test_the_list_is_read_a_page_at_a_time(
    crds: KubeCluster, namespace: str, api: ApiClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One answer with 10,000 DispatchJobs outlasted the API server's 60 s handler timeout (the
    # store's first list never completed): the list goes by pages, every object still in it once.
    for i in range(5):
        apply(crds, namespace, dispatch_job(f"paged-{i}"))
    monkeypatch.setattr(_objects, "PAGE", 2)
    pages: list[dict[str, object]] = []
    custom = _objects.CustomObjects(api)
    inner = api.call_api

    async def counted(path: str, method: str, **options: Any) -> Any:
        pages.append(dict(options["query_params"]))
        return await inner(path, method, **options)

    monkeypatch.setattr(api, "call_api", counted)
    items, version = await custom.list(namespace)
    assert sorted(i["metadata"]["name"] for i in items) == [f"paged-{i}" for i in range(5)]
    assert version
    assert [p.get("limit") for p in pages] == ["2", "2", "2"]
    assert "continue" not in pages[0]
    assert all(p.get("continue") for p in pages[1:])

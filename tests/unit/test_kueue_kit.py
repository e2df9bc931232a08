"""The kit's side of Kueue in front: a queued object is created held with no
Kueue label, released by ONE patch that adds Kueue's labels and leaves it suspended, stopped by a
patch that also takes Kueue's label away and then deleted (its Workload goes with it); Kueue is
watched only where the API server serves its Workloads, and a queued job is refused elsewhere."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncIterator, Iterable
from typing import Any

import pytest

from dispatch import KubeflowOptions, PlanError, make_plan
from dispatch._backends.kubeflow._adapter import PYTORCHJOB
from dispatch._constants import (
    ANNOTATION_ENDED,
    ANNOTATION_QUEUE,
    ANNOTATION_RELEASED,
    KUEUE_LABEL_PRIORITY_CLASS,
    KUEUE_LABEL_QUEUE,
)
from dispatch._kubeclient import Informer
from dispatch._model import Cause, CauseKind, JobSpec, Plan
from dispatch._workload import WorkloadBackend
from dispatch._workload._kueue import Workloads
from tests.support.recorded import JsonResponse

Body = dict[str, Any]
NS, JOB = "team", "finetune"
OID = f"{NS}/{JOB}-1"
PATH = PYTORCHJOB.resource.path(NS, f"{JOB}-1")


def _merge(target: Body, patch: Body) -> Body:
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)
    return target


def _json_patch(target: Body, ops: list[Body]) -> bool:
    """Apply ``ops`` (test, add, replace, remove) as the API server does; False when a test fails
    (a missing member tests equal to null, as in evanphx/json-patch)."""
    done = copy.deepcopy(target)
    for op in ops:
        *parents, key = [k.replace("~1", "/").replace("~0", "~") for k in op["path"].split("/")[1:]]
        at = done
        for k in parents:
            at = at.setdefault(k, {}) if op["op"] != "test" else (at.get(k) or {})
        if op["op"] == "test" and at.get(key) != op["value"]:
            return False
        if op["op"] in ("add", "replace"):
            at[key] = copy.deepcopy(op["value"])
        elif op["op"] == "remove":
            at.pop(key, None)
    target.clear()
    target.update(done)
    return True


class FakeApi:
    """An API server of one namespace's PyTorchJobs, with or without Kueue's group: it applies merge
    and JSON patches and deletions (kept while a finalizer is there) and records every write."""

    def __init__(self, *, kueue: bool) -> None:
        self.kueue = kueue
        self.objects: dict[str, Body] = {}
        self.writes: list[tuple[str, str, Any]] = []
        self.rv = 10
        self.failing_deletes = 0
        """How many DELETEs to answer 503 (the API server under load) before doing them."""

    async def call_api(
        self, path: str, method: str, *, query_params: Iterable[tuple[str, str]], body: Any = None, **_: Any
    ) -> JsonResponse:
        if path == "/apis/kueue.x-k8s.io/v1beta2":
            if not self.kueue:
                return JsonResponse(404, {"reason": "NotFound", "message": path})
            return JsonResponse(200, {"resources": [{"name": "workloads"}, {"name": "workloads/status"}]})
        if method != "GET":
            self.writes.append((method, path, copy.deepcopy(body)))
        found = self.objects.get(path)
        if found is None:
            return JsonResponse(404, {"reason": "NotFound", "message": path})
        if method == "GET":
            return JsonResponse(200, found)
        if method == "DELETE" and self.failing_deletes > 0:
            self.failing_deletes -= 1
            return JsonResponse(503, {"reason": "ServiceUnavailable", "message": "try again"})
        if method == "PATCH" and isinstance(body, list):
            if not _json_patch(found, body):
                return JsonResponse(422, {"reason": "Invalid", "message": "the test operation failed"})
        elif method == "PATCH":
            _merge(found, body)
        elif method == "DELETE":
            found["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
        self.rv += 1
        found["metadata"]["resourceVersion"] = str(self.rv)
        return JsonResponse(200, found)


def spec(queue: str | None = "team-a") -> JobSpec:
    return JobSpec(
        name=JOB,
        command=("python", "train.py"),
        queue=queue,
        workload_priority_class="high" if queue else None,
        kubeflow=KubeflowOptions(image="pytorch:2"),
    )


@pytest.fixture
async def made() -> AsyncIterator[list[WorkloadBackend]]:
    backends: list[WorkloadBackend] = []
    yield backends
    for backend in backends:
        await backend.aclose()


@pytest.fixture(autouse=True)
def _no_watch(monkeypatch: pytest.MonkeyPatch) -> None:
    async def idle(self: Informer[Any]) -> None:
        self.synced.set()
        await asyncio.sleep(3600)

    monkeypatch.setattr(Informer, "run", idle)


async def backend_on(api: FakeApi, made: list[WorkloadBackend]) -> WorkloadBackend:
    backend = WorkloadBackend(PYTORCHJOB, api, owner=None)  # type: ignore[arg-type]
    made.append(backend)
    await backend.prepare()
    return backend


def held(api: FakeApi, job: JobSpec, backend: WorkloadBackend) -> Body:
    """The object create() would POST (built by the kind, held for the queue), as the API stores it."""
    from dispatch._workload._kind import Target
    from dispatch._workload._kueue import hold_for_queue

    body = hold_for_queue(PYTORCHJOB.build(Target(NS, JOB, 1), job, Plan(job=f"{NS}/{JOB}")), job)
    body["metadata"].update(uid="u-1", resourceVersion="5")
    api.objects[PATH] = body
    return body


async def test_kueue_is_watched_only_where_its_workloads_are_served(made: list[WorkloadBackend]) -> None:
    with_kueue = await backend_on(FakeApi(kueue=True), made)
    without = await backend_on(FakeApi(kueue=False), made)
    assert with_kueue.capabilities.queues
    assert not without.capabilities.queues
    assert with_kueue.capabilities.native == without.capabilities.native == PYTORCHJOB.capabilities.native
    make_plan(f"{NS}/{JOB}", spec(), with_kueue.capabilities, supervised=True)
    with pytest.raises(PlanError) as caught:  # refused at once, with the field: never pending in silence
        make_plan(f"{NS}/{JOB}", spec(), without.capabilities, supervised=True)
    assert caught.value.field == "spec.queue"
    assert Workloads.shared(with_kueue.api, None) is with_kueue.verdicts.workloads  # one watch, shared


async def test_the_release_of_a_queued_object_is_one_patch_that_leaves_it_suspended(
    made: list[WorkloadBackend],
) -> None:
    api = FakeApi(kueue=True)
    backend = await backend_on(api, made)
    body = held(api, spec(), backend)
    assert not any(k.startswith("kueue.x-k8s.io/") for k in body["metadata"]["labels"])
    assert body["metadata"]["annotations"][ANNOTATION_QUEUE] == "team-a"
    await backend.release(OID)
    assert len(api.writes) == 1
    method, path, patch = api.writes[0]
    assert (method, path) == ("PATCH", PATH)
    assert "spec" not in patch  # dispatch never unsuspends a queued object: Kueue does, on admission
    assert patch["metadata"]["labels"] == {KUEUE_LABEL_QUEUE: "team-a", KUEUE_LABEL_PRIORITY_CLASS: "high"}
    assert ANNOTATION_RELEASED in patch["metadata"]["annotations"]
    assert patch["metadata"]["resourceVersion"] == "5"  # only the object the record names canonical
    stored = api.objects[PATH]
    assert stored["spec"]["runPolicy"]["suspend"] is True
    await backend.release(OID)  # released already (and still suspended): never a second write
    assert len(api.writes) == 1


async def test_an_unqueued_object_is_released_by_unsuspending_it(made: list[WorkloadBackend]) -> None:
    api = FakeApi(kueue=True)
    backend = await backend_on(api, made)
    held(api, spec(None), backend)
    await backend.release(OID)
    ((_, _, patch),) = api.writes
    assert {"op": "replace", "path": "/spec/runPolicy/suspend", "value": False} in patch
    assert not [op for op in patch if "labels" in op["path"]]  # no queue label: Kueue leaves it be
    assert api.objects[PATH]["spec"]["runPolicy"]["suspend"] is False


async def test_a_stop_of_a_queued_object_takes_kueues_label_away_and_deletes_it(
    made: list[WorkloadBackend],
) -> None:
    api = FakeApi(kueue=True)
    backend = await backend_on(api, made)
    held(api, spec(), backend)
    await backend.release(OID)
    cause = Cause(kind=CauseKind.PREEMPTED, detail="preempted by Kueue")
    await backend.stopper.patch(OID, cause)
    (_, _, stop), (method, path, _) = api.writes[1:]
    # Kueue would unsuspend a suspended object whose Workload it admitted while the label is there.
    assert stop["metadata"]["labels"] == {KUEUE_LABEL_QUEUE: None}
    assert stop["spec"] == {"runPolicy": {"suspend": True}}
    assert json.loads(stop["metadata"]["annotations"][ANNOTATION_ENDED])["kind"] == "preempted"
    assert (method, path) == ("DELETE", PATH)  # its Workload goes with it: no requeue by Kueue
    stored = api.objects[PATH]
    assert KUEUE_LABEL_QUEUE not in stored["metadata"]["labels"]
    assert stored["metadata"]["deletionTimestamp"]  # kept by dispatch's finalizer until recorded


async def test_the_delete_of_a_stopped_queued_object_is_retried(made: list[WorkloadBackend]) -> None:
    # Once the annotation is written the stop counts as landed: a lost DELETE would leave the
    # object's Workload in Kueue's queue, to be admitted again and hold quota for nothing.
    api = FakeApi(kueue=True)
    backend = await backend_on(api, made)
    held(api, spec(), backend)
    await backend.release(OID)
    api.failing_deletes = 2
    await backend.stopper.patch(OID, Cause(kind=CauseKind.PREEMPTED, detail="preempted by Kueue"))
    assert [m for m, _, _ in api.writes] == ["PATCH", "PATCH", "DELETE", "DELETE", "DELETE"]
    assert api.objects[PATH]["metadata"]["deletionTimestamp"]


def trainjob_spec() -> JobSpec:
    from dispatch._backends.trainjob import TrainJobOptions

    return JobSpec(
        name=JOB,
        command=("python", "train.py"),
        queue="team-a",
        options={"trainjob": TrainJobOptions(runtime="torch-distributed")},
    )


@pytest.mark.parametrize("webhook", [False, True], ids=["no-kueue-webhook", "kueue-webhook"])
async def test_a_queued_trainjob_carries_kueues_runtime_patch_once(
    webhook: bool, made: list[WorkloadBackend]
) -> None:
    # Kueue's TrainJob integration starts a TrainJob only with its runtimePatches entry, which its
    # mutating webhook appends at creation; where that webhook does not run the release adds it.
    from dispatch._backends.trainjob._kind import TRAINJOB
    from dispatch._workload._kind import Target
    from dispatch._workload._kueue import KUEUE_RUNTIME_PATCH_MANAGER, hold_for_queue

    api = FakeApi(kueue=True)
    backend = WorkloadBackend(TRAINJOB, api, owner=None)  # type: ignore[arg-type]
    made.append(backend)
    await backend.prepare()
    job = trainjob_spec()
    body = hold_for_queue(TRAINJOB.build(Target(NS, JOB, 1), job, Plan(job=f"{NS}/{JOB}")), job)
    ours = list(body["spec"]["runtimePatches"])
    kueues = {"manager": KUEUE_RUNTIME_PATCH_MANAGER, "trainingRuntimeSpec": {"template": {"spec": {}}}}
    if webhook:
        body["spec"]["runtimePatches"].append(kueues)
    body["metadata"].update(uid="u-1", resourceVersion="5")
    path = TRAINJOB.resource.path(NS, f"{JOB}-1")
    api.objects[path] = body
    backend.cache.remember(OID, f"{NS}/{JOB}", body)  # the cache: a projection without runtimePatches
    await backend.release(OID)
    ((_, _, patch),) = api.writes
    assert patch["metadata"]["labels"][KUEUE_LABEL_QUEUE] == "team-a"
    assert "suspend" not in patch.get("spec", {})
    if webhook:
        assert "spec" not in patch
    else:
        assert patch["spec"] == {"runtimePatches": [*ours, kueues]}  # dispatch's own entry kept
    managers = [p["manager"] for p in api.objects[path]["spec"]["runtimePatches"]]
    assert managers.count(KUEUE_RUNTIME_PATCH_MANAGER) == 1

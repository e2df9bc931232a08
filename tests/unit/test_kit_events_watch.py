"""The kit's disruption Events come from one watch per field selector, kept as a slim index by object.

bench-operator (1,000 jobs, mass preemption): 55% of the operator's CPU was json.loads of the
namespace's Events LIST, read again on every look for evidence. The watches keep, per object the
kit tracks, only the few Events about it (:data:`EVENT`), and an Event that arrives after the end
it explains wakes the job. These tests feed the watch handler (``cache.events.changed``) as the
informer does, on the recordings of the real stack (tests/unit/data) and on small cases.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dispatch._backends.kubeflow._adapter import PYTORCHJOB, KubeflowBackend
from dispatch._kubeclient import Informer
from dispatch._model import CauseKind, ObjectView, Phase
from dispatch._workload import WorkloadBackend
from dispatch._workload import _events as backend_module
from dispatch._workload._evidence import event_evidence, event_objects, evidence_events
from dispatch._workload._kept import EVENT, project_event
from tests.support.kit import BACKENDS, CREATED, master_pod, pytorchjob
from tests.support.recorded import RecordedApi, final, late_clock, load, orders, replay, restarted

DATA = Path(__file__).parent / "data"
Body = dict[str, Any]

WITH_EVENTS = [
    ("kubeflow", "env-refused"),
    ("kubeflow", "preempt-never"),
    ("kubeflow", "preempt-onfailure"),
    ("kubeflow", "taint-never"),
    ("job", "preempt-native"),
    ("job", "preempt-never"),
    ("jobset", "preempt"),
]
"""The recordings whose views need a disruption Event in some order of the watches (the others have
none, or their pods say it all: kubeflow/notready-deleted, trainjob/preempt)."""


def watched_events(backend: WorkloadBackend, data: Body) -> list[Body]:
    """The recording's Events that the backend's watches select (kind and reason)."""
    wanted = set(evidence_events(backend.kind))
    return [
        e for e in data["events"] if ((e.get("involvedObject") or {}).get("kind"), e.get("reason")) in wanted
    ]


def listed(backend: WorkloadBackend) -> None:
    """As if the backend's Events watches had listed (no informer runs in these tests)."""
    informer: Informer[Body] = Informer(
        backend.api,
        "/api/v1/events",
        label_selector="",
        on_change=backend.cache.events.changed,
        what="events",
    )
    informer.synced.set()
    backend.cache.events.informers = {None: [informer]}


def feeding(
    make: Callable[..., WorkloadBackend], data: Body, apis: list[Any], *, watch: bool
) -> Callable[..., WorkloadBackend]:
    """``make`` whose backends (with ``watch``) get the recording's Events from the watch before any
    object, and whose API clients are kept in ``apis``."""

    def made(api: Any, **options: Any) -> WorkloadBackend:
        backend = make(api, **options)
        apis.append(api)
        if watch:
            listed(backend)
            for event in watched_events(backend, data):
                backend.cache.events.changed(None, project_event(copy.deepcopy(event)))
        return backend

    return made


def events_read(apis: list[Any]) -> list[str]:
    return [c for api in apis for c in api.calls if c.endswith("/events")]


@pytest.mark.parametrize(("backend", "name"), WITH_EVENTS)
async def test_the_watch_explains_each_recording_as_the_list_did_and_reads_no_events(
    observer: list[WorkloadBackend], backend: str, name: str
) -> None:
    """Every order of the object and pod watches, and a process started after it all: the views are
    those the Events LIST gave (which the recording needed: it was read), with no Events LIST."""
    _, make, resource = BACKENDS[backend]
    data = load(DATA / backend, name)
    data = {**data, "stream": [e for e in data["stream"] if e["resource"] in (resource, "pods")]}
    if not final(data, resource):
        pytest.skip("the object is gone at the end of the recording: nothing to list")
    streams = [*orders(data, resource).values(), restarted(data, resource)]
    views: dict[bool, list[ObjectView]] = {False: [], True: []}
    apis: dict[bool, list[Any]] = {False: [], True: []}
    for watch in (False, True):
        for events in streams:
            born = late_clock(data) if events is streams[-1] else None
            make_one = feeding(make, data, apis[watch], watch=watch)
            views[watch].append(await replay(make_one, observer, data, events, resource=resource, born=born))
    assert views[True] == views[False]
    assert events_read(apis[False])
    assert not events_read(apis[True])


# ---- small cases --------------------------------------------------------------------------------------


def preempted(pod: str, *, at: str = "2026-12-01T12:05:00.123456Z", namespace: str = "team") -> Body:
    """kube-scheduler's Preempted Event (events.k8s.io: eventTime set, the old timestamps null)."""
    return {
        "kind": "Event",
        "apiVersion": "v1",
        "metadata": {
            "name": f"{pod}.18ed210b77f506c8",
            "namespace": namespace,
            "uid": "3da0b079",
            "resourceVersion": "810",
            "creationTimestamp": at[:19] + "Z",
            "managedFields": [{"manager": "kube-scheduler", "operation": "Update"}],
        },
        "involvedObject": {
            "kind": "Pod",
            "name": pod,
            "namespace": namespace,
            "uid": "5c52",
            "apiVersion": "v1",
        },
        "reason": "Preempted",
        "message": "Preempted by pod c10cd389-d2f4-4077-83d4-6103b2dca8b1 on node kwok-node-2",
        "related": {"kind": "Pod", "name": "preemptor", "namespace": namespace},
        "source": {},
        "reportingComponent": "default-scheduler",
        "reportingInstance": "default-scheduler-vm",
        "action": "Preempting",
        "type": "Normal",
        "eventTime": at,
        "firstTimestamp": None,
        "lastTimestamp": None,
    }


def kit(clock: float = 1.8e9) -> tuple[WorkloadBackend, RecordedApi]:
    """A read-only kit backend whose watches are these tests (an empty cluster answers its reads)."""
    api = RecordedApi({"stream": [], "events": []})
    backend = KubeflowBackend(api, stop_ended=False, clock=lambda: clock)  # type: ignore[arg-type]
    backend.watches.tasks = [asyncio.get_running_loop().create_task(asyncio.sleep(3600))]  # no informer runs
    listed(backend)
    return backend, api


async def test_an_event_of_a_tracked_object_is_kept_slim_under_it_and_wakes_its_job(
    observer: list[WorkloadBackend],
) -> None:
    backend, _ = kit()
    observer.append(backend)
    wakes: list[int] = []
    backend.subscribe("team/train", lambda: wakes.append(1))
    backend.watches.object_changed(None, backend.cache.packed(pytorchjob()))
    wakes.clear()
    event = preempted("train-1-master-0")
    backend.cache.events.changed(None, project_event(event))
    assert wakes == [1]
    kept = backend.cache.events.evidence["team/train-1"]
    assert list(kept) == ["team/train-1-master-0.18ed210b77f506c8"]
    slim = next(iter(kept.values()))
    assert set(slim) <= set(EVENT)
    assert "managedFields" not in slim["metadata"]
    assert "related" not in slim
    backend.cache.events.changed(None, project_event(event))  # listed again: no change, no wake
    assert wakes == [1]


async def test_events_about_pods_that_are_not_the_kits_are_not_indexed(
    observer: list[WorkloadBackend],
) -> None:
    backend, _ = kit()
    observer.append(backend)
    backend.watches.object_changed(None, backend.cache.packed(pytorchjob()))
    for pod in ("train-1x-master-0", "other-7-abc12", "train-1-launcher-0", "nodash"):
        backend.cache.events.changed(None, project_event(preempted(pod)))
    backend.cache.events.changed(None, project_event(preempted("train-1-master-0", namespace="elsewhere")))
    assert backend.cache.events.evidence == {}
    assert "team/train-1x" not in backend.cache.events.evidence
    assert event_objects(PYTORCHJOB, preempted("a-b-3-master-0")) == ("a-b-3",)


async def test_an_event_before_its_object_waits_for_it_bounded(
    observer: list[WorkloadBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a restart, or from a second operator, an Event may come before its object's watch."""
    backend, _ = kit()
    observer.append(backend)
    backend.cache.events.changed(None, project_event(preempted("train-1-master-0")))
    assert "team/train-1" in backend.cache.events.early
    backend.watches.object_changed(None, backend.cache.packed(pytorchjob()))
    assert list(backend.cache.events.evidence) == ["team/train-1"]
    assert "team/train-1" not in backend.cache.events.early
    monkeypatch.setattr(backend_module, "MAX_EARLY_EVENTS", 3)
    for i in range(10):
        backend.cache.events.changed(None, project_event(preempted(f"peer-{i}-abcde")))
    assert list(backend.cache.events.early) == ["team/peer-7", "team/peer-8", "team/peer-9"]


async def test_only_events_from_after_the_objects_creation_count(observer: list[WorkloadBackend]) -> None:
    """A job deleted and created again reuses the names of its objects and pods."""
    backend, _ = kit()
    observer.append(backend)
    backend.subscribe("team/train", lambda: None)
    backend.watches.object_changed(None, backend.cache.packed(pytorchjob()))
    backend.cache.events.changed(
        None, project_event(preempted("train-1-master-0", at="2026-12-01T11:59:58.000000Z"))
    )
    assert backend.cache.events.evidence == {}
    [view] = await backend.list("team/train")
    assert view.cause is not None
    assert view.cause.kind is CauseKind.UNKNOWN, view


async def test_the_index_drops_deleted_events_forgotten_and_recorded_objects(
    observer: list[WorkloadBackend],
) -> None:
    backend, _ = kit()
    observer.append(backend)
    for name in ("train-1", "train-2", "train-3"):
        backend.watches.object_changed(None, backend.cache.packed(pytorchjob(name)))
        backend.cache.events.changed(None, project_event(preempted(f"{name}-master-0")))
    assert sorted(backend.cache.events.evidence) == ["team/train-1", "team/train-2", "team/train-3"]
    backend.cache.events.changed(project_event(preempted("train-1-master-0")), None)  # the API server's TTL
    backend.watches.object_changed(backend.cache.packed(pytorchjob("train-2")), None)  # deleted
    recorded = pytorchjob("train-3", annotations={"dispatch.dev/ended": '{"kind":"preempted","detail":"x"}'})
    recorded["metadata"]["resourceVersion"] = "11"
    backend.watches.object_changed(
        backend.cache.packed(pytorchjob("train-3")), backend.cache.packed(recorded)
    )  # its cause is written on it
    assert backend.cache.events.evidence == {}


async def test_an_event_after_the_end_wakes_the_job_and_is_read_without_a_request(
    observer: list[WorkloadBackend],
) -> None:
    """The pod watch lags, or the pods went before this process saw them: the end is first seen
    unexplained; the scheduler's Event then explains it, with no read of the API server."""
    backend, api = kit()
    observer.append(backend)
    wakes: list[int] = []
    backend.subscribe("team/train", lambda: wakes.append(1))
    backend.watches.object_changed(None, backend.cache.packed(pytorchjob()))
    [view] = await backend.list("team/train")
    assert view.phase is Phase.ENDED
    assert view.cause is not None
    assert view.cause.kind is CauseKind.UNKNOWN
    reads = list(api.calls)
    assert reads == ["GET /api/v1/namespaces/team/pods"]  # the pods, once; no Events LIST
    wakes.clear()
    backend.cache.events.changed(None, project_event(preempted("train-1-master-0")))
    assert wakes == [1]
    [view] = await backend.list("team/train")
    assert view.cause is not None
    assert view.cause.kind is CauseKind.PREEMPTED, view
    assert "from its event" in view.cause.detail
    assert api.calls == reads


def recreated_pod() -> Body:
    """The master of team/train-1 as its controller made it again after a preemption: running,
    nothing on it says what happened to the pod before it."""
    return master_pod("pod-2", "30", "kwok-node-1", {"phase": "Running"})


@pytest.mark.parametrize("watched", [False, True])
async def test_a_preemption_while_no_process_watched_is_read_from_its_event(
    observer: list[WorkloadBackend], watched: bool
) -> None:
    """The operator was down while kube-scheduler preempted the pod of a restartPolicy: Never
    PyTorchJob and the training operator made it again (it replaces a deleted pod whatever the
    policy): the process started after it sees a running pod, and only the Event says it was
    preempted. Seen in the crash test (SIGKILL at random moments) on the real stack. An object
    released after this process started ends on the Event too: in a mass preemption the Event
    can come seconds before the pod watch brings the pod's own word."""
    born = 1.7e9 if watched else 1.8e9  # before or after the object started (2026-12-01)
    backend, api = kit(clock=born)
    observer.append(backend)
    # The Preempted watch lists first, the others a moment later (so it went on the real stack):
    # the wake of its Event is read from the index before every Events watch has listed.
    backend.cache.events.informers[None].append(
        Informer(
            backend.api,
            "/api/v1/events",
            label_selector="",
            on_change=backend.cache.events.changed,
            what="evicted",
        )
    )
    released = pytorchjob(ended=False)
    assert not PYTORCHJOB.in_place(released)
    wakes: list[int] = []
    backend.subscribe("team/train", lambda: wakes.append(1))
    backend.watches.object_changed(None, backend.cache.packed(released))
    backend.watches.pod_changed(None, backend.cache.packed_pod(recreated_pod()))
    [view] = await backend.list("team/train")
    assert view.phase is Phase.RUNNING
    wakes.clear()
    backend.cache.events.changed(None, project_event(preempted("train-1-master-0")))  # the Events watch lists
    assert wakes == [1]
    [view] = await backend.list("team/train")
    assert view.phase is Phase.ENDED, view
    assert view.cause is not None
    assert view.cause.kind is CauseKind.PREEMPTED, view
    assert "from its event" in view.cause.detail
    assert not [c for c in api.calls if c.endswith("/events")]  # from the index, no Events LIST


def refused_pods() -> Body:
    """The training operator's FailedCreatePod Event (PodSecurity refused a pod)."""
    return {
        **preempted("train-1-master-0"),
        "involvedObject": {"kind": "PyTorchJob", "name": "train-1", "namespace": "team", "uid": "9e1"},
        "reason": PYTORCHJOB.create_failure_reason,
        "message": 'pods "train-1-worker-0" is forbidden: violates PodSecurity "restricted:latest"',
    }


def taint_evicted() -> Body:
    """kube-controller-manager's taint eviction Event: it deletes a tainted node's terminated pods too."""
    return {
        **preempted("train-1-master-0"),
        "reason": "TaintManagerEviction",
        "message": "Marking for deletion Pod team/train-1-master-0",
    }


@pytest.mark.parametrize("event", [refused_pods, taint_evicted], ids=["create-failure", "taint-eviction"])
async def test_an_event_that_can_follow_another_end_does_not_end_a_watched_object_with_a_running_pod(
    observer: list[WorkloadBackend], event: Callable[[], Body]
) -> None:
    """Read early, an Event may only say a disruption of a live pod. The training operator's
    FailedCreatePod ends an object with no pod at all (after ``PODLESS_AFTER_SECONDS``), never one
    whose pod runs; the taint manager deletes a node's terminated pods too, so its Event may follow
    an out-of-memory the pod watch has not delivered yet (two jobs' pods on one tainted node, as in
    the OOM-and-node-loss integration test, make it possible)."""
    backend, _ = kit(clock=1.7e9)  # this process watched the object from its release
    observer.append(backend)
    backend.subscribe("team/train", lambda: None)
    backend.watches.object_changed(None, backend.cache.packed(pytorchjob(ended=False)))
    backend.watches.pod_changed(None, backend.cache.packed_pod(recreated_pod()))
    body = event()
    assert event_evidence(PYTORCHJOB, pytorchjob(ended=False), [body]) is not None  # it would say it
    backend.cache.events.changed(None, project_event(body))
    [view] = await backend.list("team/train")
    assert view.phase is Phase.RUNNING, view


async def test_a_mass_preemption_costs_no_events_read(observer: list[WorkloadBackend]) -> None:
    """1,000 objects ended with their pods gone, each explained by its Event from the watch."""
    backend, api = kit()
    observer.append(backend)
    jobs = [f"team/j{i}" for i in range(1000)]
    for i, job in enumerate(jobs):
        backend.subscribe(job, lambda: None)
        backend.watches.object_changed(None, backend.cache.packed(pytorchjob(f"j{i}-1")))
        backend.cache.events.changed(None, project_event(preempted(f"j{i}-1-master-0")))
    causes = {v.cause.kind for job in jobs for v in await backend.list(job) if v.cause is not None}
    assert causes == {CauseKind.PREEMPTED}
    assert not [c for c in api.calls if c.endswith("/events")]
    assert len(api.calls) == len(jobs)  # one pods LIST each (the pod watch may lag), as before


async def test_a_change_of_a_job_nobody_subscribed_to_is_told_to_the_others_hook(
    observer: list[WorkloadBackend],
) -> None:
    """The operator lets go of a settled job; an object of it that appears later (created after it
    settled) is told to ``subscribe_others``, and never a change of a job with a subscriber."""
    backend, _ = kit()
    observer.append(backend)
    others: list[str] = []
    unsubscribe = backend.subscribe_others(others.append)
    backend.watches.object_changed(None, backend.cache.packed(pytorchjob(ended=False)))
    assert others == ["team/train"]
    wakes: list[int] = []
    backend.subscribe("team/train", lambda: wakes.append(1))
    backend.watches.object_changed(None, backend.cache.packed(pytorchjob(ended=True)))
    assert (others, wakes) == (["team/train"], [1])
    unsubscribe()
    backend.watches.object_changed(None, backend.cache.packed(pytorchjob("train-2", ended=False)))
    assert others == ["team/train"]


async def test_the_pods_a_stuck_controller_leaves_are_deleted_each_by_name_whatever_one_answers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The cleanup after a stop (``pod_cleanup_after``): one DELETE per pod the watch still shows
    running, by name; one that fails (a 503, a pod already gone) neither stops the others nor
    escapes the task. (A 503 cannot be had from the real API server at will; the cleanup against
    it is ``test_pods_a_stopped_objects_controller_leaves_running_are_deleted_by_dispatch``.)"""
    from aiohttp import web

    from dispatch._kubeclient import Connection, KubeClient
    from tests.support.local_http import serving

    seen: list[str] = []

    async def handle(req: web.Request) -> web.Response:
        seen.append(f"{req.method} {req.path}")
        status = {"train-1-master-0": 503, "train-1-worker-0": 404}.get(req.path.rsplit("/", 1)[-1], 200)
        return web.json_response({"kind": "Status", "code": status, "message": "no"}, status=status)

    second = copy.deepcopy(recreated_pod())
    second["metadata"].update(name="train-1-worker-1", uid="pod-3")
    gone = copy.deepcopy(recreated_pod())
    gone["metadata"].update(name="train-1-worker-0", uid="pod-4")
    deleting = copy.deepcopy(recreated_pod())
    deleting["metadata"].update(name="train-1-worker-2", uid="pod-5", deletionTimestamp=CREATED)
    async with serving(handle) as host, KubeClient(Connection(host=host)) as client:
        backend = KubeflowBackend(client, stop_ended=False)
        backend.watches.object_changed(None, backend.cache.packed(pytorchjob(ended=False)))
        for pod in (recreated_pod(), gone, second, deleting):
            backend.watches.pod_changed(None, backend.cache.packed_pod(pod))
        with caplog.at_level("WARNING", logger="dispatch.kubeflow"):
            await backend.stopper.cleanup_pods("team/train-1")
    assert sorted(seen) == [
        f"DELETE /api/v1/namespaces/team/pods/{name}"
        for name in ("train-1-master-0", "train-1-worker-0", "train-1-worker-1")
    ]  # not the pod already being deleted, and no DELETE by label selector
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1, warned
    assert "train-1-master-0" in warned[0], warned
    assert "503" in warned[0], warned

"""The kit's slim cache: what it keeps of an object or a pod says the same as the whole body.

The kit caches each object as ``object_shape(kind)`` (the kind's declared :attr:`Kind.projection`
plus the metadata the kit reads) and each pod as ``POD``, never the whole body. These tests take
every event recorded from the real stack (tests/unit/data/<backend>/*.json) and check that every
read the kit and the kinds make gives the same answer on the projection as on the whole body: one
field read but not declared fails them. Then the same recordings go through the backend's own
watch handlers with and without the projection, and every ``list()`` must agree.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dispatch import _registry
from dispatch._backends.kubeflow._adapter import PYTORCHJOB, KubeflowBackend
from dispatch._kubeclient import key_of
from dispatch._kubeclient._informer import compacted
from dispatch._model import Cause, CauseKind, ObjectView
from dispatch._workload import (
    POD,
    SHARED,
    Clip,
    Kind,
    Prefixed,
    Select,
    Shared,
    WorkloadBackend,
    _mask,
    classify,
    conditions,
    container_restarts,
    failed_exit,
    object_shape,
    parse_time,
    project,
    project_object,
    project_pod,
)
from dispatch._workload._cache import Cache
from dispatch._workload._classify import held_outside
from dispatch._workload._evidence import best, event_evidence, kind_evidence, needs_node
from dispatch._workload._fields import no_capacity_after, owner_of, restart_budget
from dispatch._workload._kept import METADATA
from tests.support.kit import BACKENDS
from tests.support.recorded import final, late_clock, load, names, orders, replay, restarted

DATA = Path(__file__).parent / "data"
Body = dict[str, Any]
# backend directory -> (kind, backend class, the resource of its objects in the recordings)
RECORDINGS = [
    (backend, name)
    for backend in BACKENDS
    for name in names(DATA / backend)
    if load(DATA / backend, name)["stream"]  # webhook-refused: nothing was ever created
]
LISTED = [(b, n) for b, n in RECORDINGS if final(load(DATA / b, n), BACKENDS[b][2])]
"""The recordings whose object still exists at their end (``replay`` lists its job's one view)."""
A_RESTART = Cause(kind=CauseKind.OUT_OF_MEMORY, detail="pod x: OOMKilled", exit_code=137)
"""A latest in-place restart, so that the kinds' "backoff limit" branches are read too."""


def recording(backend: str, name: str) -> Body:
    data = load(DATA / backend, name)
    resource = BACKENDS[backend][2]
    return {**data, "stream": [e for e in data["stream"] if e["resource"] in (resource, "pods")]}


def moments(backend: str, name: str) -> Iterator[tuple[Body, list[Body]]]:
    """After each recorded event: the object as last seen and the pods that exist then."""
    resource = BACKENDS[backend][2]
    body: Body | None = None
    pods: dict[str, Body] = {}
    for event in recording(backend, name)["stream"]:
        obj = event["object"]
        if event["resource"] == resource:
            body = obj  # a deleted object is still classified on its last body (a tombstone)
        elif event["type"] == "DELETED":
            pods.pop(key_of(obj), None)
        else:
            pods[key_of(obj)] = obj
        if body is not None:
            yield body, list(pods.values())


def pod_reads(kind: Kind, body: Body, pod: Body, now: float, nodes: frozenset[str]) -> tuple[object, ...]:
    meta, status = pod.get("metadata", {}), pod.get("status", {})
    return (
        kind_evidence(kind, body, pod, now=now),
        kind_evidence(kind, body, pod, now=now, gone_nodes=nodes),
        needs_node(pod),
        kind.restarts(pod),
        container_restarts(pod, kind.container),
        failed_exit(pod, kind.container),
        key_of(pod),
        owner_of(pod),
        meta.get("uid"),
        meta.get("resourceVersion"),
        meta.get("deletionTimestamp"),
        status.get("phase"),
        pod.get("spec", {}).get("nodeName"),
    )


def reads(
    kind: Kind, body: Body, pods: list[Body], events: list[Body], now: float, nodes: frozenset[str]
) -> tuple[object, ...]:
    """Everything the kit and ``kind`` read of one object and its pods, as the kit reads it."""
    retained = best(
        e for p in pods for e in [kind_evidence(kind, body, p, now=now)[0]] if e is not None and e.terminal
    )
    meta = body.get("metadata", {})
    annotations = meta.get("annotations") or {}
    return (
        classify(kind, body, pods, now=now),
        classify(kind, body, pods, now=now, gone_nodes=nodes, retained=retained, last_restart=A_RESTART),
        [pod_reads(kind, body, p, now, nodes) for p in pods],
        kind.suspended(body),
        kind.running(body),
        kind.in_place(body),
        kind.object_restarts(body),
        kind.outcome(body, None),
        kind.outcome(body, A_RESTART),
        kind.pod_prefixes(body),
        held_outside(kind, body),
        event_evidence(kind, body, events),
        key_of(body),
        owner_of(body),
        restart_budget(body),
        no_capacity_after(body),
        sorted(annotations.items()),
        meta.get("uid"),
        meta.get("resourceVersion"),
        meta.get("creationTimestamp"),
        meta.get("deletionTimestamp"),
        meta.get("finalizers"),
        parse_time(body.get("status", {}).get("startTime")),
    )


def test_every_kit_kind_is_compared_on_its_recordings() -> None:
    """A new Kubernetes backend on the kit comes with recordings, compared here."""
    assert sorted(BACKENDS) == sorted(b.name for b in _registry.kubernetes_backends())
    assert all(isinstance(kind, Kind) for kind, _, _ in BACKENDS.values())
    assert {b for b, _ in RECORDINGS} == set(BACKENDS)


@pytest.mark.parametrize(("backend", "name"), RECORDINGS)
def test_every_read_of_the_projection_equals_the_read_of_the_whole_body(backend: str, name: str) -> None:
    kind = BACKENDS[backend][0]
    data = recording(backend, name)
    now = late_clock(data)
    nodes = frozenset(
        e["object"].get("spec", {}).get("nodeName") or "" for e in data["stream"] if e["resource"] == "pods"
    )
    shape = object_shape(kind)
    for step, (body, pods) in enumerate(moments(backend, name)):
        whole = reads(kind, body, pods, data["events"], now, nodes)
        slim = reads(
            kind, project_object(shape, body), [project_pod(p) for p in pods], data["events"], now, nodes
        )
        assert slim == whole, f"{backend}/{name}, after event {step}"


@pytest.mark.parametrize(("backend", "name"), RECORDINGS)
def test_a_projection_projected_again_is_itself(backend: str, name: str) -> None:
    """The informer's store and the kit's cache hold the same objects (no second copy)."""
    shape = object_shape(BACKENDS[backend][0])
    for body, pods in moments(backend, name):
        slim = project_object(shape, body)
        assert project_object(shape, slim) is slim
        for pod in pods:
            kept = project_pod(pod)
            assert project(kept, POD) is kept


def test_the_cache_keeps_a_small_part_of_each_body() -> None:
    """Templates, managedFields, specs of containers: none of it is cached (a regression that keeps
    a whole body would show here first; the bytes are measured by bench/kit_memory.py)."""
    whole = slim = 0
    for backend, name in RECORDINGS:
        shape = object_shape(BACKENDS[backend][0])
        for event in recording(backend, name)["stream"]:
            obj = event["object"]
            kept = project_pod(obj) if event["resource"] == "pods" else project_object(shape, obj)
            text = json.dumps(kept)
            for dropped in ('"template"', '"image"', '"fieldsType"'):
                assert dropped not in text
            whole += len(json.dumps(obj))
            slim += len(text)
    assert slim * 4 < whole, (slim, whole)


async def views(backend: str, name: str, made: list[WorkloadBackend]) -> list[ObjectView]:
    _, make, resource = BACKENDS[backend]
    data = recording(backend, name)
    out = [
        await replay(make, made, data, events, resource=resource)
        for events in orders(data, resource).values()
    ]
    out.append(
        await replay(make, made, data, restarted(data, resource), resource=resource, born=late_clock(data))
    )
    return out


@pytest.mark.parametrize(("backend", "name"), LISTED)
async def test_the_backend_lists_the_same_on_projections(
    observer: list[WorkloadBackend], backend: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recordings through the backend's own watch handlers, in every order and after a restart:
    the views are the ones the whole bodies give."""
    slim = await views(backend, name, observer)
    packed = [t.current() for b in observer for t in b.cache.tracked.values()]
    packed += [p for b in observer for t in b.cache.tracked.values() for p in t.pods.values()]
    cached = [p.body() for p in packed if p is not None]
    assert cached
    assert all(set(c.get("metadata", {})) <= {*METADATA, "managedFields"} for c in cached)
    with monkeypatch.context() as patched:
        patched.setattr(Cache, "project_pod", lambda self, pod: pod)
        patched.setattr(Cache, "project", lambda self, body: body)
        whole = await views(backend, name, observer)
    assert slim == whole


def containers(value: object) -> Iterator[object]:
    """Every dict and list inside ``value`` (``value`` too)."""
    if isinstance(value, dict):
        yield value
        for item in value.values():
            yield from containers(item)
    elif isinstance(value, list):
        yield value
        for item in value:
            yield from containers(item)


@pytest.mark.parametrize(("backend", "name"), RECORDINGS)
def test_a_listed_page_is_cached_as_its_projections_allocated_anew(backend: str, name: str) -> None:
    """The informer's list keeps of each item of a page exactly the kit's projection (what the
    kit's readers are compared on above), none of it inside the page's own bodies (which would keep
    the page's memory after a restart), the shared strings still one copy."""
    shape = object_shape(BACKENDS[backend][0])
    for resource, project_one in (
        (BACKENDS[backend][2], lambda body: project_object(shape, body)),
        ("pods", project_pod),
    ):
        page = [
            json.loads(json.dumps(e["object"]))
            for e in recording(backend, name)["stream"]
            if e["resource"] == resource
        ]
        items = list(page)
        kept = compacted(project_one, items)
        assert items == []  # the page's bodies are the caller's to free
        assert kept == [project_one(body) for body in page]
        assert all(project_one(body) is body for body in kept)  # the kit projects them again: itself
        inside = {id(c) for body in page for c in containers(body)}
        assert not any(id(c) in inside for body in kept for c in containers(body))
        for body in kept:
            for condition in body.get("status", {}).get("conditions", []):
                assert condition["type"] is sys.intern(condition["type"])


# Every kind of shape at once, for values of any JSON form (the shape's compiled projector, checked
# against what the shape says, not against a second walker).
ANY_SHAPE: dict[str, Any] = {
    "whole": True,
    "clipped": Clip(2),
    "shared": SHARED,
    "labels": Prefixed(("dispatch.dev/",)),
    "each": ({"a": True, "b": SHARED},),
    "conditions": conditions("Ready", mask={"type": SHARED, "status": True}),
    "nested": {"x": {"y": True}},
}
KEYS = st.sampled_from([*ANY_SHAPE, "a", "b", "x", "y", "type", "status", "dispatch.dev/job", "other"])
LEAVES = st.none() | st.booleans() | st.integers() | st.sampled_from(["Ready", "True"]) | st.text(max_size=8)
VALUES = st.recursive(
    LEAVES,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(KEYS | st.text(max_size=2), inner, max_size=5)
    ),
    max_leaves=25,
)
CONDITIONS = st.lists(
    st.fixed_dictionaries(
        {"type": st.sampled_from(["Ready", "True", "x"]) | VALUES}, optional={"status": LEAVES, "a": LEAVES}
    ),
    max_size=4,
)
BODIES = st.dictionaries(KEYS, VALUES | CONDITIONS, max_size=8)


def _check(value: Any, shape: Any, kept: Any) -> None:
    """``kept`` is what ``shape`` names of ``value``, and nothing else."""
    if shape is True:
        assert kept is value
    elif isinstance(shape, Clip):
        assert kept == (value[: shape.limit] if isinstance(value, str) else value)
    elif isinstance(shape, Shared):
        assert kept == value
        if isinstance(value, str):
            assert kept is sys.intern((value + ".")[:-1])  # one copy for every equal string
    elif isinstance(shape, Prefixed):
        if isinstance(value, dict):
            assert kept == {k: v for k, v in value.items() if k.startswith(shape.prefixes)}
        else:
            assert kept is value
    elif isinstance(shape, Select):
        if isinstance(value, list):
            wanted = [
                i
                for i in value
                if not isinstance(i, dict)
                or (isinstance(i.get(shape.key), str) and i[shape.key] in shape.values)
            ]
            assert len(kept) == len(wanted)
            for a, b in zip(wanted, kept, strict=True):
                _check(a, shape.mask, b)
        else:
            assert kept is value
    elif isinstance(shape, tuple):
        if isinstance(value, list):
            assert len(kept) == len(value)
            for a, b in zip(value, kept, strict=True):
                _check(a, shape[0], b)
        else:
            assert kept is value
    elif isinstance(value, dict):
        assert set(kept) == set(value) & set(shape)
        for key in kept:
            _check(value[key], shape[key], kept[key])
    else:
        assert kept is value


# No deadline or speed check: the machines are shared, and time is the benchmarks' business.
@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(BODIES)
def test_a_projection_keeps_what_its_shape_names_and_projected_again_is_itself(value: Any) -> None:
    kept = project(value, ANY_SHAPE)
    _check(value, ANY_SHAPE, kept)
    assert project(kept, ANY_SHAPE) is kept


def test_equal_shared_strings_of_two_bodies_are_kept_as_one_copy() -> None:
    one, two = (
        {"shared": "".join(["Run", "ning"]), "each": [{"b": "".join(["no", "de-7"])}]} for _ in range(2)
    )
    assert one["shared"] is not two["shared"]
    a, b = project(one, ANY_SHAPE), project(two, ANY_SHAPE)
    assert a == b == one
    assert a["shared"] is b["shared"]
    assert a["each"][0]["b"] is b["each"][0]["b"]


def test_backends_of_one_kind_share_one_shape_and_one_compiled_projector() -> None:
    """The compiled projectors live as long as the process: making backends must not add more."""
    body = {"metadata": {"name": "x", "namespace": "team"}, "spec": {}}
    KubeflowBackend(None, stop_ended=False).cache.project(body)  # type: ignore[arg-type]
    before = len(_mask._PROJECTORS)
    for _ in range(5):
        KubeflowBackend(None, stop_ended=False).cache.project(body)  # type: ignore[arg-type]
    assert len(_mask._PROJECTORS) == before
    assert object_shape(PYTORCHJOB) is object_shape(PYTORCHJOB)

"""Replaying recordings of the real stack through a workload-kit backend's own watch handlers.

The recordings (tests/unit/data/<backend>/*.json, written by hack/record.py <backend> from the lab)
hold the watch events of one object and its pods in arrival order, and the events Kubernetes wrote.
:func:`replay` feeds them to the backend's watch handlers (``watches.object_changed`` /
``watches.pod_changed``; no informer runs) and answers the backend's reads from the recording's final state
(:class:`RecordedApi`), refusing every write: the backend is a read-only observer.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Container, Iterable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from dispatch._kubeclient import Packed
from dispatch._model import ObjectView
from dispatch._workload import WorkloadBackend, parse_time

Body = dict[str, Any]
B = TypeVar("B", bound=WorkloadBackend)


def load(directory: Path, name: str) -> Body:
    data: Body = json.loads((directory / f"{name}.json").read_text())
    return data


def names(directory: Path, known: Container[str] | None = None) -> list[str]:
    """The recordings in ``directory`` (only those in ``known``, when given), sorted."""
    return sorted(p.stem for p in directory.glob("*.json") if known is None or p.stem in known)


def states(directory: Path, resource: str) -> list[Body]:
    """Every state of ``resource`` the recordings in ``directory`` hold, in order of recording."""
    streams = (load(directory, name)["stream"] for name in names(directory))
    return [e["object"] for stream in streams for e in stream if e["resource"] == resource]


def watched(directory: Path, name: str, resource: str) -> Body:
    """A recording with only what the backend watches (the object and its pods); the events of
    other objects it holds (a JobSet's or TrainJob's child Jobs) stay out of the stream."""
    data = load(directory, name)
    return {**data, "stream": [e for e in data["stream"] if e["resource"] in (resource, "pods")]}


@pytest.fixture
async def observer() -> AsyncIterator[list[WorkloadBackend]]:
    """The backends a test replays into; each is closed afterwards."""
    made: list[WorkloadBackend] = []
    yield made
    for backend in made:
        await backend.aclose()


class JsonResponse:
    """An API server's answer as the client's response object gives it (``body`` as JSON)."""

    connection = None
    """Read whole at once: nothing for ``streamed`` to abort."""

    def __init__(self, status: int, body: Body) -> None:
        self.status = status
        self.reason = "OK" if status < 300 else "Error"
        self._raw = json.dumps(body).encode()

    async def read(self) -> bytes:
        return self._raw

    def release(self) -> None:
        pass

    def close(self) -> None:
        pass


class RecordedApi:
    """Answers the adapter's reads from one recording (the state at its end); refuses writes."""

    def __init__(self, data: Body) -> None:
        self.pods = final(data, "pods")
        self.events: list[Body] = data["events"]
        self.nodes = {o["metadata"]["name"]: o for o in data.get("objects", []) if o.get("kind") == "Node"}
        self.calls: list[str] = []

    async def call_api(
        self, path: str, method: str, *, query_params: Iterable[tuple[str, str]], **_: Any
    ) -> JsonResponse:
        self.calls.append(f"{method} {path}")
        assert method == "GET", f"a read-only observer wrote: {method} {path}"
        query = dict(query_params)
        if path.endswith("/events"):
            wanted = dict(kv.split("=", 1) for kv in query.get("fieldSelector", "").split(",") if kv)
            items = [
                e
                for e in self.events
                if e.get("reason") == wanted.get("reason")
                and (e.get("involvedObject") or {}).get("kind") == wanted.get("involvedObject.kind")
            ]
            return JsonResponse(200, {"items": items})
        if path.endswith("/pods"):
            wanted = dict(kv.split("=", 1) for kv in query.get("labelSelector", "").split(",") if kv)
            items = [
                p
                for p in self.pods
                if all(p["metadata"].get("labels", {}).get(k) == v for k, v in wanted.items())
            ]
            return JsonResponse(200, {"items": items})
        if path.startswith("/api/v1/nodes/"):
            recorded = self.nodes.get(path.rsplit("/", 1)[-1])
            if recorded is not None:  # as the recording left it
                return JsonResponse(200, recorded)
            return JsonResponse(200, {"status": {"conditions": [{"type": "Ready", "status": "True"}]}})
        return JsonResponse(404, {"reason": "NotFound", "message": path})


def final(data: Body, resource: str) -> list[Body]:
    """The objects of ``resource`` that still existed when the recording ended."""
    alive: dict[str, Body] = {}
    for event in data["stream"]:
        if event["resource"] != resource:
            continue
        key = event["object"]["metadata"]["name"]
        if event["type"] == "DELETED":
            alive.pop(key, None)
        else:
            alive[key] = event["object"]
    return list(alive.values())


def late_clock(data: Body) -> float:
    """A clock past every threshold of the recording (no-capacity waits, the pod-creation wait)."""
    times = [
        parse_time(c.get("lastTransitionTime"))
        for e in data["stream"]
        for c in e["object"].get("status", {}).get("conditions") or []
    ]
    return max(t for t in times if t is not None) + 3600


def orders(data: Body, resource: str) -> dict[str, list[Body]]:
    """The recorded stream as recorded, and with either watch lagging the other entirely."""
    stream = data["stream"]
    return {
        "as-recorded": stream,
        "pod-watch-first": [e for e in stream if e["resource"] == "pods"]
        + [e for e in stream if e["resource"] != "pods"],
        f"{resource}-watch-first": [e for e in stream if e["resource"] != "pods"]
        + [e for e in stream if e["resource"] == "pods"],
    }


def restarted(data: Body, resource: str) -> list[Body]:
    """What a process that starts after it all happened lists: the final objects, as ADDED."""
    return [{"resource": r, "type": "ADDED", "object": o} for r in (resource, "pods") for o in final(data, r)]


async def replay(
    make: Callable[..., B],
    made: list[B],
    data: Body,
    events: list[Body],
    *,
    resource: str,
    born: float | None = None,
) -> ObjectView:
    """Feed ``events`` to a fresh read-only backend (``make(api, stop_ended=False, clock=...)``) and
    return the one view its ``list()`` gives for the recording's job."""
    api = RecordedApi(data)
    now = late_clock(data)
    backend = make(api, stop_ended=False, clock=lambda: now)
    if born is not None:
        backend.verdicts.born = born
    made.append(backend)
    # The watches are this replay: no informer runs.
    backend.watches.tasks = [asyncio.get_running_loop().create_task(asyncio.sleep(3600))]
    seen: dict[tuple[str, str], Packed] = {}
    for event in events:
        obj, key = event["object"], (event["resource"], event["object"]["metadata"]["name"])
        before = seen.get(key)
        # As the informer does: each body projected and packed as its event arrives.
        pack: Callable[[Body], Packed]
        if event["resource"] == resource:
            handler, pack = backend.watches.object_changed, backend.cache.packed
        else:
            handler, pack = backend.watches.pod_changed, backend.cache.packed_pod
        if event["type"] == "DELETED":
            seen.pop(key, None)
            handler(before or pack(obj), None)
        else:
            seen[key] = kept = pack(obj)
            handler(before, kept)
    obj = final(data, resource)[0]
    labels = obj["metadata"]["labels"]
    views = await backend.list(f"{obj['metadata']['namespace']}/{labels['dispatch.dev/job']}")
    assert len(views) == 1
    return views[0]

"""CustomObjects (the record store's and the plugin's DispatchJob requests) over dispatch's own
client, against a real local HTTP server that answers as the API server would: the paths, the
field manager, the merge-patch content type, a list read page by page, the error statuses mapped
to ApiError's kinds, and a streamed watch (bookmarks, a 410 inside the stream)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from dispatch import TransientBackendError
from dispatch._kubeclient import (
    MERGE_PATCH,
    ApiError,
    Conflict,
    CustomObjects,
    Gone,
    NotFound,
    _objects,
    client_for,
)
from dispatch._kubeclient._transport import Connection
from tests.support.local_http import serving

BASE = "/apis/dispatch.dev/v1alpha1"
Seen = list[tuple[str, str, dict[str, str], str, Any]]
"""method, path, query, content type, decoded body."""


@pytest.fixture
async def api() -> AsyncIterator[tuple[CustomObjects, Seen]]:
    seen: Seen = []
    pages = {"": ("a", "t1"), "t1": ("b", "t2"), "t2": ("c", "")}

    async def handle(req: web.Request) -> web.StreamResponse:
        raw = await req.read()
        body = json.loads(raw) if raw else None
        seen.append((req.method, req.path, dict(req.query), req.content_type, body))
        after = req.path.split("/dispatchjobs", 1)[1].strip("/")
        name = after.split("/", 1)[0] or "dispatchjobs"
        if name == "missing":
            return web.json_response({"reason": "NotFound", "message": "not there"}, status=404)
        if name == "stale":
            return web.json_response({"reason": "Conflict", "message": "changed"}, status=409)
        if name == "busy":
            return web.json_response({"reason": "InternalError", "message": "etcd"}, status=500)
        if name == "forbidden":
            return web.json_response({"reason": "Forbidden", "message": "no"}, status=403)
        if req.query.get("watch") == "true":
            response = web.StreamResponse()
            await response.prepare(req)
            events = [
                {"type": "ADDED", "object": {"metadata": {"name": "w", "resourceVersion": "8"}}},
                {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}},
                {"type": "ERROR", "object": {"code": 410, "message": "too old resource version"}},
            ]
            for event in events:
                await response.write(json.dumps(event).encode() + b"\n")
            await response.write_eof()
            return response
        if req.method == "GET" and name == "dispatchjobs":
            item, token = pages[req.query.get("continue", "")]
            meta = {"resourceVersion": "7", **({"continue": token} if token else {})}
            return web.json_response({"items": [{"metadata": {"name": item}}], "metadata": meta})
        return web.json_response({"metadata": {"name": name}})

    async with serving(handle) as host:
        client = client_for(Connection(host=host, token="t"))
        try:
            yield CustomObjects(client), seen
        finally:
            await client.close()


async def test_writes_name_the_field_manager_and_the_patch_type(api: tuple[CustomObjects, Seen]) -> None:
    objects, seen = api
    await objects.create("team-a", {"metadata": {"name": "j"}})
    await objects.replace_status("team-a", "j", {"metadata": {"resourceVersion": "5"}, "status": {"n": 1}})
    await objects.merge_patch("team-a", "j", {"metadata": {"finalizers": ["f"]}})
    assert (await objects.get("team-a", "j"))["metadata"]["name"] == "j"
    await objects.delete("team-a", "j")
    await objects.delete("team-a", "missing")  # already gone: nothing to do
    manager = {"fieldManager": "dispatch-operator"}
    path = f"{BASE}/namespaces/team-a/dispatchjobs"
    assert seen == [
        ("POST", path, manager, "application/json", {"metadata": {"name": "j"}}),
        (
            "PUT",
            f"{path}/j/status",
            manager,
            "application/json",
            {"metadata": {"resourceVersion": "5"}, "status": {"n": 1}},
        ),
        ("PATCH", f"{path}/j", manager, MERGE_PATCH, {"metadata": {"finalizers": ["f"]}}),
        ("GET", f"{path}/j", {}, "application/json", None),
        ("DELETE", f"{path}/j", {}, "application/json", None),
        ("DELETE", f"{path}/missing", {}, "application/json", None),
    ]


async def test_error_statuses_are_apierror_kinds_and_5xx_is_transient(
    api: tuple[CustomObjects, Seen],
) -> None:
    objects, _ = api
    with pytest.raises(NotFound, match="not there"):
        await objects.get("team-a", "missing")
    with pytest.raises(Conflict, match="changed") as conflict:
        await objects.replace_status("team-a", "stale", {})
    assert conflict.value.status == 409
    with pytest.raises(ApiError) as forbidden:
        await objects.merge_patch("team-a", "forbidden", {})
    assert forbidden.value.status == 403
    assert not isinstance(forbidden.value, NotFound | Conflict | Gone)
    with pytest.raises(TransientBackendError, match="etcd"):
        await objects.get("team-a", "busy")


async def test_a_list_goes_by_pages_in_every_namespace_or_one(
    api: tuple[CustomObjects, Seen], monkeypatch: pytest.MonkeyPatch
) -> None:
    objects, seen = api
    monkeypatch.setattr(_objects, "PAGE", 1)
    items, version = await objects.list()
    assert [i["metadata"]["name"] for i in items] == ["a", "b", "c"]
    assert version == "7"
    assert [(p, q) for _, p, q, _, _ in seen] == [
        (f"{BASE}/dispatchjobs", {"limit": "1"}),
        (f"{BASE}/dispatchjobs", {"limit": "1", "continue": "t1"}),
        (f"{BASE}/dispatchjobs", {"limit": "1", "continue": "t2"}),
    ]
    seen.clear()
    await objects.list("team-a", label_selector="a=b")
    assert seen[0][1:3] == (f"{BASE}/namespaces/team-a/dispatchjobs", {"limit": "1", "labelSelector": "a=b"})


async def test_a_watch_streams_its_events_and_a_410_in_the_stream_is_gone(
    api: tuple[CustomObjects, Seen],
) -> None:
    objects, seen = api
    got: list[tuple[str, str]] = []

    async def read() -> None:
        async for event in objects.watch("team-a", resource_version="7", timeout_seconds=60):
            got.append((event.type, event.object["metadata"]["resourceVersion"]))

    with pytest.raises(Gone, match="too old"):
        await read()
    assert got == [("ADDED", "8"), ("BOOKMARK", "9")]
    assert seen[0][2] == {
        "watch": "true",
        "allowWatchBookmarks": "true",
        "timeoutSeconds": "60",
        "resourceVersion": "7",
    }

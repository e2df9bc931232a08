"""The record store's shared DispatchJob watch is the kit's :class:`Informer` (one list+watch
implementation for every resource the operator watches): a streamed list where the API server
serves one, pages where it refuses it, each page handed on before the next is asked for (the
whole bodies of every DispatchJob held at once would be the operator's peak after a restart), and
a re-list after 410 that tells the loop which jobs were deleted while no watch ran.

Against a real local HTTP server that answers as the API server does (a streamed list or its
refusal, pages with ``continue``, watches with an ERROR 410 inside the stream), through dispatch's
own client. The real API servers (one with streamed lists, one without) are
tests/integration/test_streamed_lists.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from dispatch._controller.store import KubeRecordStore
from dispatch._decide import Authorize
from dispatch._kubeclient import client_for
from dispatch._kubeclient._informer import INITIAL_EVENTS_END
from dispatch._kubeclient._transport import Connection
from tests.support.local_http import serving
from tests.support.records import PENDING, at, dispatch_job, step

Body = dict[str, Any]
PATH = "/apis/dispatch.dev/v1alpha1/namespaces/team-a/dispatchjobs"
GUARD = 10.0


def job(name: str, version: int = 1) -> Body:
    body = at(dispatch_job(step(PENDING, Authorize(submission=1))), version)
    body["metadata"]["name"] = name
    return body


class Server:
    """DispatchJobs as the API server serves them: ``lists`` (each a list of pages, the first the
    first list, the next one after a 410), a streamed list of the same unless ``streams`` is off
    (refused as invalid, 422), and watches from a resourceVersion that say ``watches`` in turn
    (events; the last one's stream stays open). ``said`` is what was asked for, in order."""

    def __init__(self, lists: list[list[list[Body]]], watches: list[list[Body]], *, streams: bool) -> None:
        self.lists = lists
        self.watches = watches
        self.streams = streams
        self.said: list[str] = []
        self.done = asyncio.Event()

    def version(self, listed: list[list[Body]]) -> str:
        return str(100 + sum(len(page) for page in listed))

    async def handle(self, req: web.Request) -> web.StreamResponse:
        assert req.path == PATH, req.path
        query = req.query
        if query.get("watch") != "true":
            token = query.get("continue", "")
            i = int(token or 0)
            self.said.append(f"page {i}")
            pages = self.lists[0]
            last = i == len(pages) - 1
            if last:
                self.lists.pop(0)
            meta = {"resourceVersion": self.version(pages)} if last else {"continue": str(i + 1)}
            return web.json_response({"items": pages[i], "metadata": meta})
        if query.get("sendInitialEvents") == "true":
            self.said.append("streamed list")
            if not self.streams:
                message = "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch"
                return web.json_response({"reason": "Invalid", "message": message}, status=422)
            pages = self.lists.pop(0)
            end = {"resourceVersion": self.version(pages), "annotations": {INITIAL_EVENTS_END: "true"}}
            events = [*({"type": "ADDED", "object": o} for page in pages for o in page)]
            events.append({"type": "BOOKMARK", "object": {"metadata": end}})
            return await self.stream(req, events + self.watches.pop(0))
        self.said.append(f"watch from {query.get('resourceVersion')}")
        return await self.stream(req, self.watches.pop(0))

    async def stream(self, req: web.Request, events: list[Body]) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(req)
        for event in events:
            await response.write(json.dumps(event).encode() + b"\n")
        if not self.watches:  # nothing more to say: open until the test ends
            await self.done.wait()
        await response.write_eof()
        return response


class Told(list[tuple[str, str, list[str]]]):
    """What the store's listener was told, and a wait for more."""

    def __init__(self) -> None:
        super().__init__()
        self.more = asyncio.Event()

    def tell(self, job: str, version: str, said: list[str]) -> None:
        self.append((job, version, list(said)))
        self.more.set()

    async def until(self, n: int) -> None:
        async with asyncio.timeout(GUARD):
            while len(self) < n:
                self.more.clear()
                await self.more.wait()


@contextlib.asynccontextmanager
async def watching(server: Server) -> AsyncIterator[tuple[KubeRecordStore, Told]]:
    """A store watching ``server``; yields it and what its listener was told: (job, the body's
    resourceVersion or "deleted", what had been asked for by then), "synced" once listed."""
    told = Told()
    async with serving(server.handle) as host:
        api = client_for(Connection(host=host, token="t"))
        store = KubeRecordStore(api, namespaces=["team-a"])

        def on_event(job: str, body: Body | None) -> None:
            version = "deleted" if body is None else body["metadata"]["resourceVersion"]
            told.tell(job, version, server.said)

        store.watch_all(on_event, lambda: told.tell("synced", "", server.said))
        try:
            yield store, told
        finally:
            server.done.set()
            await store.aclose()
            await api.close()


async def test_each_page_is_handed_on_before_the_next_is_asked_for() -> None:
    server = Server(
        [[[job("a"), job("b")], [job("c")]]], [[{"type": "MODIFIED", "object": job("a", 105)}]], streams=False
    )
    async with watching(server) as (_, told):
        await told.until(5)
    refused = ["streamed list"]  # refused: pages from then on
    assert told == [
        ("team-a/a", "1", [*refused, "page 0"]),
        ("team-a/b", "1", [*refused, "page 0"]),  # in the page's order, the next page not asked for yet
        ("team-a/c", "1", [*refused, "page 0", "page 1"]),
        ("synced", "", [*refused, "page 0", "page 1"]),
        ("team-a/a", "105", [*refused, "page 0", "page 1", "watch from 103"]),  # the list's version
    ]


async def test_a_streamed_list_is_handed_on_as_it_comes_and_its_watch_goes_on() -> None:
    server = Server(
        [[[job("a"), job("b")], [job("c")]]],
        [[{"type": "MODIFIED", "object": job("b", 104)}], [{"type": "MODIFIED", "object": job("a", 105)}]],
        streams=True,
    )
    async with watching(server) as (_, told):
        await told.until(6)
    assert told == [
        ("team-a/a", "1", ["streamed list"]),
        ("team-a/b", "1", ["streamed list"]),
        ("team-a/c", "1", ["streamed list"]),
        ("synced", "", ["streamed list"]),
        ("team-a/b", "104", ["streamed list"]),  # the same response, after the bookmark
        ("team-a/a", "105", ["streamed list", "watch from 104"]),  # then from the last version
    ]


@pytest.mark.parametrize("streams", [True, False], ids=["streamed", "pages"])
async def test_a_relist_after_410_drops_the_jobs_deleted_while_no_watch_ran(streams: bool) -> None:
    """A DispatchJob deleted while the watch's resourceVersion had expired sends no DELETED: the
    re-list is the only sign, and without it the job stayed cached and supervised."""
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old resource version"}}
    watches: list[list[Body]] = [[gone], []] if not streams else [[], [gone], []]
    server = Server([[[job("kept"), job("gone")]], [[job("kept", 7)]]], watches, streams=streams)
    async with watching(server) as (store, told):
        await told.until(5)
        assert sorted(store._views) == ["team-a/kept"]
    listed = ["streamed list"] if streams else ["streamed list", "page 0"]
    relisted = ["streamed list"] if streams else ["page 0"]
    asked = [*listed, "watch from 102", *relisted]
    assert told == [
        ("team-a/kept", "1", listed),
        ("team-a/gone", "1", listed),
        ("synced", "", listed),
        ("team-a/kept", "7", asked),
        ("team-a/gone", "deleted", asked),  # told once the re-list is whole: it was not in it
    ]

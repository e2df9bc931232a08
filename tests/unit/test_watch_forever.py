"""The shared DispatchJob watch lists by a streamed list where the API server serves one, and by
pages where it refuses it, each page handed on before it asks for the next (issue 13, "slim
caches"): the whole bodies of every DispatchJob held at once were the operator's peak after a
restart, and what the allocator kept of it. No API server: a source stands in for CustomObjects'
pages and watch, to show the order of what is asked for and handed on, and an API server without
streamed lists (the lab's serves them; the real streamed list and watch are
tests/integration/test_kube_store.py's and every operator test's).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, cast

from dispatch._kubeclient import ApiError, CustomObjects, WatchEvent, watch_forever
from dispatch._kubeclient._informer import INITIAL_EVENTS_END


def job(name: str, version: str = "1") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": version}}


class Paged:
    """Pages of a list, then one watch event; ``said`` is what was asked for, in order. With
    ``streams``, a streamed list too: its objects, the bookmark that ends them, one event more."""

    plural = "dispatchjobs"

    def __init__(self, pages: list[list[dict[str, Any]]], version: str, *, streams: bool = False) -> None:
        self._pages = pages
        self._version = version
        self._streams = streams
        self.said: list[str] = []

    async def pages(
        self, namespace: str | None = None
    ) -> AsyncIterator[tuple[list[dict[str, Any]], str | None]]:
        for i, items in enumerate(self._pages):
            self.said.append(f"page {i}")
            last = i == len(self._pages) - 1
            yield list(items), self._version if last else None

    async def watch(
        self, namespace: str | None = None, *, resource_version: str | None = None, initial: bool = False
    ) -> AsyncIterator[WatchEvent]:
        if initial:
            self.said.append("streamed list")
            if not self._streams:  # what an API server without streamed lists answers
                raise ApiError(422, "resourceVersionMatch: Forbidden: forbidden for watch")
            for item in (i for page in self._pages for i in page):
                yield WatchEvent("ADDED", item)
            end = {"resourceVersion": self._version, "annotations": {INITIAL_EVENTS_END: "true"}}
            yield WatchEvent("BOOKMARK", {"metadata": end})
            yield WatchEvent("MODIFIED", job("b", "44"))
            return
        self.said.append(f"watch from {resource_version}")
        yield WatchEvent("MODIFIED", job("a", "43"))


async def handed_on(source: Paged, n: int) -> list[tuple[str, str, list[str]]]:
    """The first ``n`` events of the shared watch on ``source``, each with what had been asked for."""
    seen: list[tuple[str, str, list[str]]] = []
    events = cast(
        AsyncGenerator[WatchEvent, None],
        watch_forever(cast(CustomObjects, source), on_listed=lambda: source.said.append("listed")),
    )
    async for event in events:
        seen.append((event.type, event.object["metadata"]["name"], list(source.said)))
        if len(seen) == n:
            break
    await events.aclose()
    return seen


async def test_each_page_is_handed_on_before_the_next_is_asked_for() -> None:
    source = Paged([[job("a"), job("b")], [job("c")]], version="42")
    seen = await handed_on(source, 4)
    refused = ["streamed list"]  # refused: pages from then on
    assert seen == [
        ("ADDED", "a", [*refused, "page 0"]),
        ("ADDED", "b", [*refused, "page 0"]),  # in the page's order, the next page not asked for yet
        ("ADDED", "c", [*refused, "page 0", "page 1"]),
        ("MODIFIED", "a", [*refused, "page 0", "page 1", "listed", "watch from 42"]),  # the last version
    ]


async def test_a_streamed_list_is_handed_on_as_it_comes_and_its_watch_goes_on() -> None:
    source = Paged([[job("a"), job("b")], [job("c")]], version="42", streams=True)
    seen = await handed_on(source, 5)
    assert seen == [
        ("ADDED", "a", ["streamed list"]),
        ("ADDED", "b", ["streamed list"]),
        ("ADDED", "c", ["streamed list"]),
        ("MODIFIED", "b", ["streamed list", "listed"]),  # the same response, after the bookmark
        ("MODIFIED", "a", ["streamed list", "listed", "watch from 44"]),  # then from the last version
    ]

"""The shared DispatchJob watch hands each list page on before it asks for the next (issue 13, "slim
caches"): the whole bodies of every DispatchJob held at once were the operator's peak after a
restart, and what the allocator kept of it. No API server: a paged source stands in for
CustomObjects' pages and watch (the real list and watch are tests/integration/test_kube_store.py's).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, cast

from dispatch._kubeclient import CustomObjects, WatchEvent, watch_forever


def job(name: str, version: str = "1") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": version}}


class Paged:
    """Pages of a list, then one watch event; ``said`` is what was asked for, in order."""

    plural = "dispatchjobs"

    def __init__(self, pages: list[list[dict[str, Any]]], version: str) -> None:
        self._pages = pages
        self._version = version
        self.said: list[str] = []

    async def pages(
        self, namespace: str | None = None
    ) -> AsyncIterator[tuple[list[dict[str, Any]], str | None]]:
        for i, items in enumerate(self._pages):
            self.said.append(f"page {i}")
            last = i == len(self._pages) - 1
            yield list(items), self._version if last else None

    async def watch(
        self, namespace: str | None = None, *, resource_version: str | None = None
    ) -> AsyncIterator[WatchEvent]:
        self.said.append(f"watch from {resource_version}")
        yield WatchEvent("MODIFIED", job("a", "43"))


async def test_each_page_is_handed_on_before_the_next_is_asked_for() -> None:
    source = Paged([[job("a"), job("b")], [job("c")]], version="42")
    seen: list[tuple[str, str, list[str]]] = []
    events = cast(
        AsyncGenerator[WatchEvent, None],
        watch_forever(cast(CustomObjects, source), on_listed=lambda: source.said.append("listed")),
    )
    async for event in events:
        seen.append((event.type, event.object["metadata"]["name"], list(source.said)))
        if len(seen) == 4:
            break
    await events.aclose()
    assert seen == [
        ("ADDED", "a", ["page 0"]),
        ("ADDED", "b", ["page 0"]),  # in the page's order, the next page not asked for yet
        ("ADDED", "c", ["page 0", "page 1"]),
        ("MODIFIED", "a", ["page 0", "page 1", "listed", "watch from 42"]),  # from the last page's version
    ]

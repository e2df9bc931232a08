"""The informer's paged list: the next page is asked for before the current one is projected.

After a restart the kit lists every pod and object in pages of :data:`PAGE`; asked one after the
other, the API server's time for each page and the loop's time for projecting the one before it
added up. These tests hold an API whose pages answer only when the test lets them, and check the
order of things, not time: the request for page k+1 is out while page k is being projected; every
object of every page is kept and handed on once; an error of a page prefetched ends the list with
that error; a list cancelled or failing leaves no page request running.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import pytest

from dispatch import TransientBackendError
from dispatch._kubeclient import Informer
from tests.support.recorded import JsonResponse

Body = dict[str, Any]


class PagedApi:
    """``pages`` pods in pages of ``size``; page k answers when ``gates[k]`` is set."""

    rest_client: Any = None

    def __init__(self, pages: int, size: int = 3, failing: int | None = None) -> None:
        self.size = size
        self.pages = pages
        self.failing = failing
        self.gates = [asyncio.Event() for _ in range(pages)]
        self.asked: list[int] = []
        self.asked_for = [asyncio.Event() for _ in range(pages)]
        self.answered: list[int] = []
        self.cancelled: list[int] = []

    async def call_api(self, resource_path: str, method: str, *args: Any, **kwargs: Any) -> JsonResponse:
        query_params: Iterable[tuple[str, str]] = kwargs["query_params"]
        query = dict(query_params)
        k = int(query.get("continue", "0"))
        self.asked.append(k)
        self.asked_for[k].set()
        try:
            await self.gates[k].wait()
        except asyncio.CancelledError:
            self.cancelled.append(k)
            raise
        self.answered.append(k)
        if k == self.failing:
            return JsonResponse(500, {"reason": "InternalError", "message": f"page {k}"})
        items = [pod(k * self.size + i) for i in range(self.size)]
        more = {"continue": str(k + 1)} if k + 1 < self.pages else {"resourceVersion": "77"}
        return JsonResponse(200, {"metadata": more, "items": items})

    async def close(self) -> None:
        pass


def pod(i: int) -> Body:
    return {"metadata": {"namespace": "team", "name": f"p{i}", "resourceVersion": str(i + 1)}}


async def test_the_next_page_is_asked_for_while_this_one_is_projected() -> None:
    api = PagedApi(pages=4)
    seen_when_projecting: list[list[int]] = []

    def project(body: Body) -> Body:
        seen_when_projecting.append(list(api.asked))
        return body

    changed: list[str] = []
    informer = Informer(
        api,
        "/api/v1/pods",
        label_selector="x",
        project=project,
        on_change=lambda old, new: changed.append((new or {})["metadata"]["name"]),
        what="pods",
    )
    task = asyncio.create_task(informer._list())
    for gate in api.gates:
        gate.set()
    await task
    # Page k's bodies are projected once page k+1 has been asked for (the last page: no next one).
    for k in range(4):
        for asked in seen_when_projecting[k * 3 * 2 : (k + 1) * 3 * 2]:
            assert asked[-1] == min(k + 1, 3)
    assert api.asked == [0, 1, 2, 3]
    assert sorted(informer.items) == sorted(f"team/p{i}" for i in range(12))
    assert sorted(changed) == sorted(f"p{i}" for i in range(12))
    assert informer.resource_version == "77"
    assert informer.synced.is_set()


async def test_a_failed_page_ends_the_list_with_its_error_and_nothing_is_kept() -> None:
    api = PagedApi(pages=4, failing=2)
    informer = Informer(api, "/api/v1/pods", label_selector="x", on_change=lambda o, n: None, what="pods")
    for gate in api.gates:
        gate.set()
    with pytest.raises(TransientBackendError, match="page 2"):
        await informer._list()
    assert api.asked == [0, 1, 2]
    assert informer.items == {}
    assert not informer.synced.is_set()


async def test_a_list_stopped_while_a_page_is_projected_cancels_the_next_page() -> None:
    api = PagedApi(pages=3)

    def project(body: Body) -> Body:
        if body["metadata"]["name"] == "p0":
            raise RuntimeError("projection failed")
        return body

    informer = Informer(
        api, "/api/v1/pods", label_selector="x", project=project, on_change=lambda o, n: None, what="pods"
    )
    api.gates[0].set()
    with pytest.raises(RuntimeError, match="projection failed"):
        await informer._list()
    await asyncio.sleep(0)  # the cancelled request runs its handler
    assert api.asked == [0, 1]
    assert api.cancelled == [1]


async def test_a_cancelled_list_leaves_no_page_request_running() -> None:
    api = PagedApi(pages=3)
    informer = Informer(api, "/api/v1/pods", label_selector="x", on_change=lambda o, n: None, what="pods")
    task = asyncio.create_task(informer._list())
    api.gates[0].set()
    await api.asked_for[1].wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0)
    assert api.cancelled == [1]

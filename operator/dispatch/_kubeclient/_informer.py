"""One shared list+watch of one resource: an in-memory cache kept current by the API server's events.

It lists (paginated) to learn the current state and a resourceVersion, then watches from there,
with bookmarks, so a reconnect resumes where it left off; a 410 Gone (the resourceVersion was
compacted away) or any other break of the stream makes it list again. Every change is handed to
``on_change(old, new)`` (``new`` None for a deletion), also the differences a re-list reveals.
With ``project``, only ``project(body)`` of each object is kept and handed on (the workload kit's
slim projection): the whole body lives only while its event is read. With ``store=False`` nothing
is kept at all: every body is only handed on (``on_change(None, body)`` for each one listed or
added or modified, ``on_change(body, None)`` for a deletion), for a consumer that keeps the few it
needs itself (the kit's disruption Events: most of a namespace's are about pods that are not its own).
A re-list then hands on every item again and cannot tell what was deleted meanwhile.
With ``pack=Packer()`` (and ``project``), what is kept and handed on is each projection packed
(:class:`Packed`: its JSON text, deflated), decoded by whoever reads it: the workload kit's cache
of objects and pods.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import zlib
from collections.abc import Callable
from typing import Any, Final, Generic, TypeVar, cast

import aiohttp

from .._errors import BackendError, TransientBackendError
from ._http import Client, KubeError, open_request, request, streamed

log = logging.getLogger("dispatch.kubeclient")

Body = dict[str, Any]
OnChange = Callable[[Body | None, Body | None], None]

WATCH_SECONDS: Final = 290
MAX_LINE: Final = 64 << 20
BACKOFF: Final = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
PAGE: Final = 100
"""Objects per list page: a page's whole bodies are the peak a list adds to the process (the kit's
pods and objects are listed at once after a restart; the allocator keeps that peak), so a small one."""


def key_of(body: Body) -> str:
    meta = body.get("metadata", {})
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def resource_version(body: Body | None) -> int | None:
    """resourceVersions are opaque; the API server's are etcd revisions, compared only as a hint."""
    if body is None:
        return None
    try:
        return int(body.get("metadata", {}).get("resourceVersion", ""))
    except ValueError:
        return None


class Packed:
    """One cached object (issue 13, "slim caches"): the JSON text of its projection, deflated with
    zlib against a ``sample`` of its kind as the preset dictionary (a :class:`Packer`'s first text),
    and its resourceVersion.

    Objects of one kind repeat one another: the same keys, labels and words, names a few characters
    apart. A PyTorchJob's or a pod's projection of about 600 bytes of JSON keeps about 110 bytes,
    and a DispatchJob's record part (:class:`~dispatch._kube.store.JobView`) of about 1,000 bytes
    keeps under 200, where the projection's dicts, lists and strings took about 2 KB spread over
    the allocator's pools. Packing costs about 10 us; :meth:`body` about 1 us more than the JSON
    decode, and each reader gets its own copy (nothing it changes is cached).
    """

    __slots__ = ("data", "sample", "version")

    def __init__(self, body: Body, sample: bytes = b"") -> None:
        text = json.dumps(body, separators=(",", ":")).encode()
        deflate = zlib.compressobj(wbits=-15, zdict=sample)  # raw deflate: no header, no checksum
        self.data: Final = deflate.compress(text) + deflate.flush()
        self.sample: Final = sample
        self.version: Final = resource_version(body)

    def text(self) -> bytes:
        """The projection's JSON text."""
        inflate = zlib.decompressobj(wbits=-15, zdict=self.sample)
        return inflate.decompress(self.data) + inflate.flush()

    def body(self) -> Body:
        decoded: Body = json.loads(self.text())
        return decoded


SAMPLE_MAX: Final = 4096
"""The most of a first text kept as the sample (its end): several times a typical projection (about
600 bytes), and a bound on the cost of setting zlib's dictionary for every object packed after it."""


class Packer:
    """Packs the objects of one kind (one informer's, the record store's): the first text it packs
    is the sample (see :class:`Packed`) of every later one, kept as long as they are."""

    def __init__(self) -> None:
        self.sample = b""

    def __call__(self, body: Body) -> Packed:
        if not self.sample:
            self.sample = json.dumps(body, separators=(",", ":")).encode()[-SAMPLE_MAX:]
        return Packed(body, self.sample)


Kept = TypeVar("Kept")
"""What an informer keeps of each object and hands on: its body (or projection), or a Packed."""


def compacted(project: Callable[[Body], Body], items: list[Body]) -> list[Body]:
    """The projections of one list page's ``items``, allocated anew once its whole bodies are freed.

    Projected in place, the kept strings and dicts of each body sit between the parts dropped, so
    the cache's bytes stay spread over the pools the page filled (after a restart, those of every
    first list). Written to one JSON text (one allocation outside those pools) and read back once
    ``items`` is emptied, they land in the freed space together; projected again for the shared
    strings (a projection of a projection is itself).
    """
    text = json.dumps([project(item) for item in items], separators=(",", ":"))
    items.clear()  # the caller holds no other reference to the page's bodies
    return [project(item) for item in json.loads(text)]


class Informer(Generic[Kept]):
    def __init__(
        self,
        api: Client,
        path: str,
        *,
        label_selector: str,
        field_selector: str = "",
        on_change: Callable[[Kept | None, Kept | None], None],
        on_relist: Callable[[str], None] | None = None,
        project: Callable[[Body], Body] | None = None,
        pack: Callable[[Body], Kept] | None = None,
        store: bool = True,
        what: str,
    ) -> None:
        self.api = api
        self.path = path
        self.label_selector = label_selector
        self.field_selector = field_selector or None
        self.on_change = on_change
        self.on_relist = on_relist
        self.project = project
        self.pack = pack
        self.store = store
        self.what = what
        self.items: dict[str, Kept] = {}
        self.synced = asyncio.Event()
        self.resource_version: str | None = None
        self.last_error: BaseException | None = None
        self.events = 0

    async def run(self) -> None:
        failures = 0
        while True:
            try:
                await self._list()
                failures = 0
                while await self._watch():
                    failures = 0
            except asyncio.CancelledError:
                raise
            except (BackendError, ValueError, aiohttp.ClientError, TimeoutError, OSError) as error:
                self.last_error = error
                delay = BACKOFF[min(failures, len(BACKOFF) - 1)] * (1 + random.random() / 4)
                failures += 1
                level = (
                    logging.DEBUG
                    if isinstance(error, TransientBackendError) and failures < 3
                    else logging.WARNING
                )
                log.log(level, "%s: %s; listing again in %.2fs", self.what, error, delay)
                await asyncio.sleep(delay)

    def _keep(self, body: Body) -> Kept:
        """What is kept and handed on of ``body`` (projected already)."""
        return self.pack(body) if self.pack is not None else cast(Kept, body)

    @staticmethod
    def _version(kept: Kept) -> int | None:
        return kept.version if isinstance(kept, Packed) else resource_version(cast(Body, kept))

    async def _list(self) -> None:
        fresh: dict[str, Kept] = {}
        token: str | None = None
        while True:
            page = await request(
                self.api,
                "GET",
                self.path,
                query={
                    "labelSelector": self.label_selector,
                    "fieldSelector": self.field_selector,
                    "limit": PAGE,
                    "continue": token,
                },
                request_timeout=60,
            )
            meta = page.get("metadata") or {}
            items = page.get("items") or []
            del page
            if self.store and self.project is not None and self.pack is None:
                # Dict projections gathered anew once the page is freed; a packed projection is
                # one block already, made as each body is read (below).
                for projected in compacted(self.project, items):
                    fresh[key_of(projected)] = self._keep(projected)
            else:
                for item in items:
                    projected = self.project(item) if self.project is not None else item
                    if self.store:
                        fresh[key_of(projected)] = self._keep(projected)
                    else:
                        self.on_change(None, self._keep(projected))
            del items
            token = meta.get("continue") or None
            if token is None:
                self.resource_version = str(meta.get("resourceVersion") or "") or None
                break
        old, self.items = self.items, fresh
        for key, kept in fresh.items():
            before = old.get(key)
            if before is None or self._version(before) != self._version(kept):
                self.on_change(before, kept)
        for key, kept in old.items():
            if key not in fresh:
                self.on_change(kept, None)
        self.last_error = None
        self.synced.set()
        if self.on_relist is not None and self.resource_version is not None:
            self.on_relist(self.resource_version)

    async def _watch(self) -> bool:
        """Watch from the last resourceVersion; True to watch again, False to list again (410 Gone)."""
        seconds = WATCH_SECONDS + random.randint(0, 30)
        response = await open_request(
            self.api,
            "GET",
            self.path,
            query={
                "watch": True,
                "labelSelector": self.label_selector,
                "fieldSelector": self.field_selector,
                "resourceVersion": self.resource_version,
                "allowWatchBookmarks": True,
                "timeoutSeconds": seconds,
            },
            request_timeout=aiohttp.ClientTimeout(
                total=None, connect=30, sock_connect=30, sock_read=seconds + 30
            ),
        )
        async with streamed(response):
            while True:
                line = await response.content.readline(max_line_length=MAX_LINE)
                if not line:
                    return True
                if not line.strip():
                    continue
                event = json.loads(line)
                kind = event.get("type")
                obj = event.get("object") or {}
                if kind == "ERROR":
                    code = int(obj.get("code") or 0)
                    if code == 410:
                        log.debug("%s: watch expired (410 Gone); listing again", self.what)
                        return False
                    raise KubeError(
                        "WATCH", self.path, code, str(obj.get("reason") or ""), str(obj.get("message") or "")
                    )
                rv = obj.get("metadata", {}).get("resourceVersion")
                if rv:
                    self.resource_version = str(rv)
                if kind == "BOOKMARK":
                    continue
                self.events += 1
                if self.project is not None:
                    obj = self.project(obj)
                kept = self._keep(obj)
                if not self.store:
                    if kind == "DELETED":
                        self.on_change(kept, None)
                    else:
                        self.on_change(None, kept)
                    continue
                key = key_of(obj)
                before = self.items.get(key)
                if kind == "DELETED":
                    self.items.pop(key, None)
                    self.on_change(before if before is not None else kept, None)
                else:
                    self.items[key] = kept
                    self.on_change(before, kept)

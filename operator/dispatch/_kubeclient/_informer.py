"""One shared list+watch of one resource: an in-memory cache kept current by the API server's events.

It lists to learn the current state and a resourceVersion, then watches from there,
with bookmarks, so a reconnect resumes where it left off; a 410 Gone (the resourceVersion was
compacted away) or any other break of the stream makes it list again. Every change is handed to
``on_change(old, new)`` (``new`` None for a deletion), also the differences a re-list reveals.
With ``project``, only ``project(body)`` of each object is kept and handed on (the workload kit's
slim projection): the whole body lives only while its event is read. With ``store=False`` nothing
is kept at all: every body is only handed on (``on_change(None, body)`` for each one listed or
added or modified, ``on_change(body, None)`` for a deletion), for a consumer that keeps the few it
needs itself (the kit's disruption Events: most of a namespace's are about pods that are not its own;
the record store's DispatchJobs, which it keeps as its own views). A re-list then hands on every item
again; a consumer that must tell what was deleted meanwhile is told where each list begins
(``on_listing()``) and ends (``on_relist(resource_version)``), and compares.
With ``pack=Packer()`` (and ``project``), what is kept and handed on is each projection packed
(:class:`Packed`: its JSON text, deflated), decoded by whoever reads it: the workload kit's cache
of objects and pods. ``read`` decodes each list page and watch event instead of a whole JSON
decode: the kit's reader builds only the part of each object its projection keeps
(``_kind.reader``).

The list is a streamed one where the API server serves those (KEP-3157, :meth:`Informer._watch`
``initial``): every object as an event, from the API server's watch cache, then the watch in the
same response; pages of :data:`PAGE` where it refuses them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
import zlib
from collections.abc import Callable, Container
from typing import Any, Final, Generic, TypeVar, cast

import aiohttp
import msgspec

from .._errors import BackendError, TransientBackendError
from ._http import Client, KubeError, open_request, request, streamed

log = logging.getLogger("dispatch.kubeclient")

Body = dict[str, Any]
OnChange = Callable[[Body | None, Body | None], None]

WATCH_SECONDS: Final = 290
MAX_LINE: Final = 64 << 20
BACKOFF: Final = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
INITIAL_EVENTS_END: Final = "k8s.io/initial-events-end"
"""The annotation of the bookmark that ends a streamed list's initial events (KEP-3157)."""
STREAMED_LIST_REFUSED: Final = frozenset({400, 422})
"""What an API server without streamed lists answers one (an invalid query: a watch with
``resourceVersionMatch``, or ``sendInitialEvents`` with the feature off)."""
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


def ends_initial_events(kind: object, obj: Body) -> bool:
    """Whether a watch event (its ``type`` and ``object``) is the bookmark that ends a streamed
    list's initial events."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    return kind == "BOOKMARK" and annotations.get(INITIAL_EVENTS_END) == "true"


_encode: Final = msgspec.json.Encoder().encode
_decode: Final = msgspec.json.Decoder().decode
"""JSON as :class:`Packed` writes and reads it: msgspec's, several times json's speed."""


class Packed:
    """One cached object: the JSON text of its projection, deflated with
    zlib against a ``sample`` of its kind as the preset dictionary (a :class:`Packer`'s first text),
    and its resourceVersion.

    Objects of one kind repeat one another: the same keys, labels and words, names a few characters
    apart. A PyTorchJob's or a pod's projection of about 600 bytes of JSON keeps about 110 bytes,
    and a DispatchJob's record part (:class:`~dispatch._controller.store.JobView`) of about 1,000 bytes
    keeps under 200, where the projection's dicts, lists and strings took about 2 KB spread over
    the allocator's pools. Packing costs about 10 us; :meth:`body` about 1 us more than the JSON
    decode, and each reader gets its own copy (nothing it changes is cached).
    """

    __slots__ = ("data", "sample", "version")

    def __init__(self, body: Body, sample: bytes = b"") -> None:
        text = _encode(body)
        deflate = zlib.compressobj(wbits=-15, zdict=sample)  # raw deflate: no header, no checksum
        self.data: Final = deflate.compress(text) + deflate.flush()
        self.sample: Final = sample
        self.version: Final = resource_version(body)

    def text(self) -> bytes:
        """The projection's JSON text."""
        inflate = zlib.decompressobj(wbits=-15, zdict=self.sample)
        return inflate.decompress(self.data) + inflate.flush()

    def body(self) -> Body:
        decoded: Body = _decode(self.text())
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
            self.sample = _encode(body)[-SAMPLE_MAX:]
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
        label_selector: str = "",
        field_selector: str = "",
        on_change: Callable[[Kept | None, Kept | None], None],
        on_listing: Callable[[], None] | None = None,
        on_relist: Callable[[str], None] | None = None,
        project: Callable[[Body], Body] | None = None,
        pack: Callable[[Body], Kept] | None = None,
        read: Callable[[bytes], Body] | None = None,
        store: bool = True,
        what: str,
    ) -> None:
        self.api = api
        self.path = path
        self.label_selector = label_selector or None
        self.field_selector = field_selector or None
        self.on_change = on_change
        self.on_listing = on_listing
        """Called as a list (or a streamed list) begins, before its first object is handed on."""
        self.on_relist = on_relist
        """Called once a whole list has been handed on (every list, the first too), with its
        resourceVersion."""
        self.project = project
        self.pack = pack
        self.read: Callable[[bytes], Body] = read or json.loads
        self.store = store
        self.what = what
        self.items: dict[str, Kept] = {}
        self.synced = asyncio.Event()
        self.resource_version: str | None = None
        self.last_error: BaseException | None = None
        self.events = 0
        self.watch_list = True
        """List by a streamed list (:meth:`_watch` ``initial``) until the API server refuses one."""
        self._since, self._count = 0.0, 0

    async def run(self) -> None:
        failures = 0
        while True:
            initial = self.watch_list
            try:
                if not initial:
                    await self._list()
                failures = 0
                while await self._watch(initial=initial):
                    failures = 0
                    initial = False
            except asyncio.CancelledError:
                raise
            except KubeError as error:
                if initial and error.status in STREAMED_LIST_REFUSED:
                    # An API server without streamed lists (KEP-3157's WatchList) refuses the
                    # query as invalid: list a page at a time from now on.
                    log.info("%s: no streamed list here (%s); listing pages", self.what, error)
                    self.watch_list = False
                    continue
                failures = await self._failed(error, failures)
            except (BackendError, ValueError, aiohttp.ClientError, TimeoutError, OSError) as error:
                failures = await self._failed(error, failures)

    async def _failed(self, error: BaseException, failures: int) -> int:
        self.last_error = error
        delay = BACKOFF[min(failures, len(BACKOFF) - 1)] * (1 + random.random() / 4)
        quiet = isinstance(error, TransientBackendError) and failures < 2
        level = logging.DEBUG if quiet else logging.WARNING
        log.log(level, "%s: %s; listing again in %.2fs", self.what, error, delay)
        await asyncio.sleep(delay)
        return failures + 1

    def _keep(self, body: Body) -> Kept:
        """What is kept and handed on of ``body`` (projected already)."""
        return self.pack(body) if self.pack is not None else cast(Kept, body)

    @staticmethod
    def _version(kept: Kept) -> int | None:
        return kept.version if isinstance(kept, Packed) else resource_version(cast(Body, kept))

    async def _list(self) -> None:
        self._begin()
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
                decode=self.read,
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
            self._count += len(items)
            del items
            token = meta.get("continue") or None
            if token is None:
                self.resource_version = str(meta.get("resourceVersion") or "") or None
                break
        for key, kept in fresh.items():
            self._changed(key, kept)
        self._listed(fresh)

    def _begin(self) -> None:
        self._since, self._count = time.monotonic(), 0
        if self.on_listing is not None:
            self.on_listing()

    def _changed(self, key: str, kept: Kept) -> None:
        """One object of a list (or a streamed list's initial events): handed on if it is new or
        another version than the one held (a list again after a break shows the same ones)."""
        before = self.items.get(key)
        self.items[key] = kept
        if before is None or self._version(before) != self._version(kept):
            self.on_change(before, kept)

    def _listed(self, listed: Container[str]) -> None:
        """A whole list has been handed on: what is held but was not in it was deleted meanwhile."""
        for key in [k for k in self.items if k not in listed]:
            self.on_change(self.items.pop(key), None)
        log.info(
            "%s: %d listed in %.2fs%s",
            self.what,
            self._count,
            time.monotonic() - self._since,
            "" if self.watch_list else " (pages)",
            extra={"listed": self._count},
        )
        self.last_error = None
        self.synced.set()
        if self.on_relist is not None and self.resource_version is not None:
            self.on_relist(self.resource_version)

    async def _watch(self, *, initial: bool = False) -> bool:
        """Watch from the last resourceVersion; True to watch again, False to list again (410 Gone).

        ``initial``: a streamed list (KEP-3157's ``sendInitialEvents``) instead of a list: every
        object as it is now, one event each, served from the API server's watch cache and handed on
        as it arrives, then a bookmark that ends them (``k8s.io/initial-events-end``), then the
        watch goes on in the same response. Against a list of pages at a restart with 10,000 jobs:
        one request instead of a hundred for each resource, never a page's whole bodies at once,
        and the API server's CPU of a list read from its cache, not from etcd."""
        if initial:
            self._begin()
        seconds = WATCH_SECONDS + random.randint(0, 30)
        query: dict[str, object] = {
            "watch": True,
            "labelSelector": self.label_selector,
            "fieldSelector": self.field_selector,
            "allowWatchBookmarks": True,
            "timeoutSeconds": seconds,
        }
        if initial:  # no resourceVersion: the state as of now (a consistent read)
            query.update(sendInitialEvents=True, resourceVersionMatch="NotOlderThan")
        else:
            query["resourceVersion"] = self.resource_version
        response = await open_request(
            self.api,
            "GET",
            self.path,
            query=query,
            request_timeout=aiohttp.ClientTimeout(
                total=None, connect=30, sock_connect=30, sock_read=seconds + 30
            ),
        )
        listed: set[str] | None = set() if initial else None
        """The keys of the initial events so far, until the bookmark that ends them."""
        async with streamed(response):
            while True:
                line = await response.content.readline(max_line_length=MAX_LINE)
                if not line:
                    if listed is not None:
                        raise TransientBackendError(f"{self.what}: the watch ended before its initial events")
                    return True
                if not line.strip():
                    continue
                event = self.read(line)
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
                meta = obj.get("metadata") or {}
                rv = meta.get("resourceVersion")
                if rv:
                    self.resource_version = str(rv)
                if kind == "BOOKMARK":
                    if listed is not None and ends_initial_events(kind, obj):
                        self._listed(listed)
                        listed = None
                    continue
                if listed is None:
                    self.events += 1
                else:
                    self._count += 1
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
                if listed is not None and kind != "DELETED":
                    listed.add(key)
                    self._changed(key, kept)
                    continue
                before = self.items.get(key)
                if kind == "DELETED":
                    self.items.pop(key, None)
                    if listed is not None:
                        listed.discard(key)
                    self.on_change(before if before is not None else kept, None)
                else:
                    self.items[key] = kept
                    self.on_change(before, kept)

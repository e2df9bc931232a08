"""Kubernetes client setup (kubeconfig, in-cluster) and small helpers for custom objects, as raw
JSON through dispatch's own client (:mod:`._transport`, :func:`._http.request`).

Used by the record store, the operator, the kubectl plugin and every backend's opener. Everything
here is a thin layer over the API server's own semantics: a PUT of ``/status`` carries the
resourceVersion that was read, and the API server answers 409 when it is stale (:class:`Conflict`).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import json
import logging
import os
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Final

import aiohttp

from .._constants import GROUP, PLURAL, REPORTING_COMPONENT, VERSION
from .._errors import TransientBackendError
from ._http import MERGE_PATCH, Client, KubeError, open_request, request, streamed
from ._informer import STREAMED_LIST_REFUSED, ends_initial_events
from ._transport import Connection, KubeClient, in_cluster_available, kubeconfig_paths, load_connection

log = logging.getLogger("dispatch.kubeapi")

Body = dict[str, Any]

FIELD_MANAGER: Final = REPORTING_COMPONENT
"""The field manager of every write dispatch makes (managedFields name it as the owner of .status)."""
USER_AGENT: Final = f"{REPORTING_COMPONENT}/{{version}}"
PAGE: Final = 500
"""Objects per page of a list (``limit``, then ``continue``)."""


class ApiError(Exception):
    """An API request failed; ``status`` is the HTTP status (0 when there was no answer)."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        super().__init__(message)


class NotFound(ApiError):
    pass


class Conflict(ApiError):
    """409: the object changed since its resourceVersion was read (or it already exists)."""


class Gone(ApiError):
    """410: a watch's resourceVersion is too old; list again."""


def job_id(namespace: str, name: str) -> str:
    """The job id of a DispatchJob: ``"<namespace>/<name>"``."""
    return f"{namespace}/{name}"


def split_job(job: str) -> tuple[str, str]:
    namespace, sep, name = job.partition("/")
    if not sep or not namespace or not name:
        raise ValueError(f"a Kubernetes job id is '<namespace>/<name>', not {job!r}")
    return namespace, name


def kubeconfig_problem(kubeconfig: str | None = None) -> str | None:
    """Why no kubeconfig can be loaded, in one line for a person, or None when one can.

    Checked before anything is read, so that a missing file is one line naming the path and where
    it came from, not a loader's message about a missing ``current-context``.
    """
    if kubeconfig is None and in_cluster_available():
        return None
    paths = kubeconfig_paths(kubeconfig)
    if kubeconfig is not None:
        origin = "--kubeconfig"
    elif os.environ.get("KUBECONFIG"):
        origin = "$KUBECONFIG"
    else:
        origin = "the default"
    for path in paths:
        if os.path.isdir(path):
            return f"kubeconfig {path} ({origin}) is a directory, not a file"
    found = [p for p in paths if os.path.isfile(p)]
    if not found:
        where = " or ".join(paths) or "(empty)"
        return f"kubeconfig {where} ({origin}) does not exist, and this is not a pod with a service account"
    unreadable = [p for p in found if not os.access(p, os.R_OK)]
    if unreadable:
        return f"kubeconfig {unreadable[0]} ({origin}) is not readable"
    return None


async def load_configuration(kubeconfig: str | None = None, *, context: str | None = None) -> Connection:
    """The connection of ``kubeconfig`` (or $KUBECONFIG, ~/.kube/config), else in-cluster.

    An explicit ``kubeconfig`` wins; without one, a pod's service account is used when present.
    Raises :class:`~dispatch.ConfigError` naming the file, context and field it cannot use.
    """
    return load_connection(kubeconfig, context=context)


async def new_client(kubeconfig: str | None = None, *, context: str | None = None) -> KubeClient:
    """A client for the cluster named by ``kubeconfig`` (see :func:`load_configuration`)."""
    return client_for(await load_configuration(kubeconfig, context=context))


def _version() -> str:
    try:
        return metadata.version("dispatch")
    except metadata.PackageNotFoundError:
        return "0"


def client_for(connection: Connection) -> KubeClient:
    """A client for ``connection`` that names dispatch as its user agent."""
    return KubeClient(connection, user_agent=USER_AGENT.format(version=_version()))


def _error(e: KubeError) -> ApiError:
    status, message = e.status, e.message
    if status == 404:
        return NotFound(status, message)
    if status == 409:
        return Conflict(status, message)
    if status == 410:
        return Gone(status, message)
    return ApiError(status, message)


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: str
    """ADDED, MODIFIED, DELETED or BOOKMARK."""
    object: Body


class CustomObjects:
    """One custom resource (group, version, plural), namespaced. Defaults to DispatchJobs.

    An error status is an :class:`ApiError` (:class:`NotFound`, :class:`Conflict`, :class:`Gone`);
    no answer, a timeout, 429 or 5xx is a :class:`~dispatch.TransientBackendError`, as for every
    other request dispatch sends (:func:`._http.open_request`).
    """

    def __init__(
        self,
        api: Client,
        *,
        group: str = GROUP,
        version: str = VERSION,
        plural: str = PLURAL,
        field_manager: str = FIELD_MANAGER,
        read: Callable[[bytes], Body] | None = None,
    ) -> None:
        self.api = api
        self.group = group
        self.version = version
        self.plural = plural
        self.field_manager = field_manager
        self.read = read
        """Decodes each watch event and list page (the record store's keeps only what it reads of a
        DispatchJob); None: the whole JSON."""

    def _path(self, namespace: str | None, name: str | None = None, sub: str | None = None) -> str:
        path = f"/apis/{self.group}/{self.version}"
        if namespace is not None:
            path += f"/namespaces/{namespace}"
        path += f"/{self.plural}"
        if name is not None:
            path += f"/{name}"
        if sub is not None:
            path += f"/{sub}"
        return path

    async def _request(self, method: str, path: str, **options: Any) -> Body:
        try:
            return await request(self.api, method, path, **options)
        except KubeError as e:
            raise _error(e) from None

    async def get(self, namespace: str, name: str) -> Body:
        return await self._request("GET", self._path(namespace, name))

    async def create(self, namespace: str, body: Mapping[str, Any]) -> Body:
        return await self._request(
            "POST", self._path(namespace), query={"fieldManager": self.field_manager}, body=dict(body)
        )

    async def replace_status(self, namespace: str, name: str, body: Mapping[str, Any]) -> Body:
        """PUT ``/status``; ``body.metadata.resourceVersion`` is the precondition (409 when stale)."""
        return await self._request(
            "PUT",
            self._path(namespace, name, "status"),
            query={"fieldManager": self.field_manager},
            body=dict(body),
        )

    async def merge_patch(self, namespace: str, name: str, patch: Mapping[str, Any]) -> Body:
        """A JSON merge patch of the object (not its status). Include metadata.resourceVersion for CAS."""
        return await self._request(
            "PATCH",
            self._path(namespace, name),
            query={"fieldManager": self.field_manager},
            body=dict(patch),
            content_type=MERGE_PATCH,
        )

    async def delete(self, namespace: str, name: str) -> None:
        with contextlib.suppress(NotFound):
            await self._request("DELETE", self._path(namespace, name))

    async def list(
        self,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> tuple[list[Body], str]:
        """Every object (in ``namespace``, or in all); returns the items and the list's resourceVersion
        (read by :meth:`pages`)."""
        items: list[Body] = []
        version = ""
        async for page, last in self.pages(
            namespace, label_selector=label_selector, field_selector=field_selector
        ):
            items.extend(page)
            version = last if last is not None else version
        return items, version

    async def pages(
        self,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> AsyncIterator[tuple[builtins.list[Body], str | None]]:
        """Every object (in ``namespace``, or in all), :data:`PAGE` at a time: each page's items, and
        with the last page the list's resourceVersion (None with the others).

        Paginated: one answer with 10,000 DispatchJobs took the API server longer than its 60 s
        handler timeout on this machine, so the list never completed. A page at a time: the whole
        bodies of 10,000 DispatchJobs held at once (before the first is looked at) were a peak of
        about 150 MB that the allocator kept, its pools spread with what the cache kept of them."""
        token: str | None = None
        while True:
            query: dict[str, object] = {
                "limit": PAGE,
                "labelSelector": label_selector or None,
                "fieldSelector": field_selector or None,
            }
            if token:
                query["continue"] = token
            result = await self._request(
                "GET", self._path(namespace), query=query, decode=self.read
            )  # 410: Gone
            items = result.get("items") or []
            meta = result.get("metadata") or {}
            del result
            token = meta.get("continue") or None
            yield items, None if token else str(meta.get("resourceVersion", ""))
            if token is None:
                return

    async def watch(
        self,
        namespace: str | None = None,
        *,
        resource_version: str | None = None,
        field_selector: str | None = None,
        timeout_seconds: int = 300,
        initial: bool = False,
    ) -> AsyncIterator[WatchEvent]:
        """One watch request from ``resource_version``; ends when the server closes it.

        Raises :class:`Gone` when ``resource_version`` is too old (list again). ``initial``: a
        streamed list instead (``sendInitialEvents``, KEP-3157; ``resource_version`` unused): every
        object as it is now, one ADDED event each, then a BOOKMARK annotated
        ``k8s.io/initial-events-end`` (:func:`~._informer.ends_initial_events`), then the watch
        goes on. An API server without streamed lists refuses it as invalid (:class:`ApiError`,
        400 or 422).
        """
        query: dict[str, object] = {
            "watch": True,
            "allowWatchBookmarks": True,
            "timeoutSeconds": timeout_seconds,
            "resourceVersion": None if initial else resource_version or None,
            "fieldSelector": field_selector or None,
        }
        if initial:  # no resourceVersion: the state as of now (a consistent read)
            query.update(sendInitialEvents=True, resourceVersionMatch="NotOlderThan")
        path = self._path(namespace)
        try:
            response = await open_request(
                self.api,
                "GET",
                path,
                query=query,
                # the server ends the watch after timeout_seconds; silence well past that is a dead peer
                request_timeout=aiohttp.ClientTimeout(
                    total=None, connect=30, sock_connect=30, sock_read=timeout_seconds + 30
                ),
            )
        except KubeError as e:
            raise _error(e) from None
        try:
            async with streamed(response):
                read = self.read or json.loads
                async for line in _lines(response.content):
                    event = read(line)
                    kind = str(event.get("type", ""))
                    obj: Body = event.get("object") or {}
                    if kind == "ERROR":
                        code = int(obj.get("code") or 0)
                        message = str(obj.get("message") or "watch error")
                        if code == 410:
                            raise Gone(code, message)
                        raise ApiError(code, message)
                    yield WatchEvent(kind, obj)
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            raise TransientBackendError(f"GET {path} (watch): {type(error).__name__}: {error}") from error


async def _lines(content: Any) -> AsyncIterator[bytes]:
    """Newline-delimited chunks of a streamed body, of any length (aiohttp's readline has a limit).

    Each chunk is split once (a streamed list's chunks hold many lines: splitting one line off the
    rest at a time copied the rest again for each)."""
    buffer = b""
    async for chunk in content.iter_any():
        if b"\n" not in chunk:
            buffer += chunk
            continue
        lines = (buffer + chunk).split(b"\n")
        buffer = lines.pop()
        for line in lines:
            if line.strip():
                yield line
    if buffer.strip():
        yield buffer


async def watch_forever(
    objects: CustomObjects,
    namespace: str | None = None,
    *,
    retry_delay: float = 1.0,
    on_listing: Callable[[], None] | None = None,
    on_listed: Callable[[], None] | None = None,
) -> AsyncIterator[WatchEvent]:
    """List, then watch from the list's resourceVersion, re-listing on 410 and reconnecting on errors.

    Every object of the initial list (and of each re-list) is yielded as an ADDED event;
    ``on_listing()`` is called before a list's first object, ``on_listed()`` once the consumer has
    taken the last of them (the cache is whole). Between the two the consumer sees exactly what
    exists: what it knew and was not listed was deleted while no watch ran (a re-list after 410).
    The list is a streamed one (:meth:`CustomObjects.watch` ``initial``: one request, each object
    handed on as it arrives, read from the API server's watch cache) unless the API server refuses
    those; then pages (:meth:`CustomObjects.pages`), each handed on before the next is asked for.
    """
    resource_version: str | None = None
    streamed_list = True
    while True:
        try:
            if resource_version is None and streamed_list:
                listing = True
                if on_listing is not None:
                    on_listing()
                try:
                    async for event in objects.watch(namespace, initial=True):
                        rv = event.object.get("metadata", {}).get("resourceVersion")
                        if listing and ends_initial_events(event.type, event.object):
                            listing = False
                            if on_listed is not None:
                                on_listed()
                        if rv and not listing:
                            resource_version = str(rv)
                        if event.type != "BOOKMARK":
                            yield event
                except ApiError as error:
                    if error.status not in STREAMED_LIST_REFUSED or not listing:
                        raise
                    log.info("%s: no streamed list here (%s); listing pages", objects.plural, error)
                    streamed_list = False
                if resource_version is None:
                    if streamed_list:
                        raise TransientBackendError(
                            f"{objects.plural}: the watch ended before its initial events"
                        )
                    continue
            if resource_version is None:
                listed = ""
                if on_listing is not None:
                    on_listing()
                async for items, last in objects.pages(namespace):
                    items.reverse()
                    while items:  # each body let go of once it is handed on
                        yield WatchEvent("ADDED", items.pop())
                    listed = last if last is not None else listed
                resource_version = listed
                if on_listed is not None:
                    on_listed()
            async for event in objects.watch(namespace, resource_version=resource_version):
                rv = event.object.get("metadata", {}).get("resourceVersion")
                if rv:
                    resource_version = str(rv)
                if event.type != "BOOKMARK":
                    yield event
        except Gone:
            resource_version = None
        except asyncio.CancelledError:
            raise
        except Exception as error:  # reconnect: the API server restarted, a timeout, a reset
            log.warning("watch on %s interrupted: %s; reconnecting", objects.plural, error)
            await asyncio.sleep(retry_delay)

"""Kubernetes client setup (kubeconfig, in-cluster) and small helpers for custom objects, as raw
JSON through dispatch's own client (:mod:`._transport`, :func:`._http.request`).

Used by the record store, the operator, the kubectl plugin and every backend's opener. Everything
here is a thin layer over the API server's own semantics: a PUT of ``/status`` carries the
resourceVersion that was read, and the API server answers 409 when it is stale (:class:`Conflict`).
"""

from __future__ import annotations

import builtins
import contextlib
import json
import logging
import os
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

import aiohttp

from .._constants import GROUP, PLURAL, REPORTING_COMPONENT, VERSION
from .._errors import TransientBackendError
from .._version import __version__
from ._http import MERGE_PATCH, Client, KubeError, open_request, request, streamed
from ._informer import MAX_LINE
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


def client_for(connection: Connection) -> KubeClient:
    """A client for ``connection`` that names dispatch as its user agent."""
    return KubeClient(connection, user_agent=USER_AGENT.format(version=__version__))


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
    ) -> None:
        self.api = api
        self.group = group
        self.version = version
        self.plural = plural
        self.field_manager = field_manager

    def path(self, namespace: str | None, name: str | None = None, sub: str | None = None) -> str:
        """The API path of the resource (in ``namespace``, or in all), of one object, of its subresource."""
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
        return await self._request("GET", self.path(namespace, name))

    async def create(self, namespace: str, body: Mapping[str, Any]) -> Body:
        return await self._request(
            "POST", self.path(namespace), query={"fieldManager": self.field_manager}, body=dict(body)
        )

    async def replace_status(self, namespace: str, name: str, body: Mapping[str, Any]) -> Body:
        """PUT ``/status``; ``body.metadata.resourceVersion`` is the precondition (409 when stale)."""
        return await self._request(
            "PUT",
            self.path(namespace, name, "status"),
            query={"fieldManager": self.field_manager},
            body=dict(body),
        )

    async def merge_patch(self, namespace: str, name: str, patch: Mapping[str, Any]) -> Body:
        """A JSON merge patch of the object (not its status). Include metadata.resourceVersion for CAS."""
        return await self._request(
            "PATCH",
            self.path(namespace, name),
            query={"fieldManager": self.field_manager},
            body=dict(patch),
            content_type=MERGE_PATCH,
        )

    async def delete(self, namespace: str, name: str, *, resource_version: str | None = None) -> None:
        """Delete the object (gone already: nothing). With ``resource_version``, only that version of
        it: another is a :class:`Conflict` (the API server's precondition)."""
        options: dict[str, Any] = {}
        if resource_version is not None:
            options["body"] = {"preconditions": {"resourceVersion": resource_version}}
        with contextlib.suppress(NotFound):
            await self._request("DELETE", self.path(namespace, name), **options)

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
            result = await self._request("GET", self.path(namespace), query=query)  # 410: Gone
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
    ) -> AsyncIterator[WatchEvent]:
        """One watch request from ``resource_version``; ends when the server closes it (the
        kubectl plugin's ``watch`` of one DispatchJob; the operator's shared watch is an
        :class:`~._informer.Informer`).

        Raises :class:`Gone` when ``resource_version`` is too old (list again).
        """
        query: dict[str, object] = {
            "watch": True,
            "allowWatchBookmarks": True,
            "timeoutSeconds": timeout_seconds,
            "resourceVersion": resource_version or None,
            "fieldSelector": field_selector or None,
        }
        path = self.path(namespace)
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
                while line := await response.content.readline(max_line_length=MAX_LINE):
                    if not line.strip():
                        continue
                    event = json.loads(line)
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

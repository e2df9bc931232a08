"""Kubernetes client setup (kubeconfig, in-cluster) and small helpers for custom objects, through
kubernetes_asyncio's generated API.

Used by the record store, the operator, the kubectl plugin and every backend's opener. Everything
here is a thin layer over the API server's own semantics: a PUT of ``/status`` carries the
resourceVersion that was read, and the API server answers 409 when it is stale (:class:`Conflict`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Final

from kubernetes_asyncio import config as kconfig
from kubernetes_asyncio.client import ApiClient, Configuration, CustomObjectsApi
from kubernetes_asyncio.client.exceptions import ApiException

from .._constants import GROUP, PLURAL, REPORTING_COMPONENT, VERSION

log = logging.getLogger("dispatch.kubeapi")

Body = dict[str, Any]

FIELD_MANAGER: Final = REPORTING_COMPONENT
"""The field manager of every write dispatch makes (managedFields name it as the owner of .status)."""
USER_AGENT: Final = f"{REPORTING_COMPONENT}/{{version}}"
IN_CLUSTER_TOKEN: Final = "/var/run/secrets/kubernetes.io/serviceaccount/token"
MERGE_PATCH: Final = "application/merge-patch+json"
PAGE: Final = 500
"""Objects per page of a list (``limit``, then ``continue``)."""
# The generated client picks another patch type for a dict body; the stubs do not declare
# _content_type, hence the dict.
_MERGE: Final[dict[str, Any]] = {"_content_type": MERGE_PATCH}


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


def _in_cluster() -> bool:
    return os.path.exists(IN_CLUSTER_TOKEN) and "KUBECONFIG" not in os.environ


def kubeconfig_problem(kubeconfig: str | None = None) -> str | None:
    """Why no kubeconfig can be loaded, in one line for a person, or None when one can.

    The client library would log "Config not found" for each path and then fail with a message
    about a missing ``current-context``: three lines, two of them wrong. The CLI and the operator
    check first with this instead.
    """
    if kubeconfig is None and _in_cluster():
        return None
    if kubeconfig is not None:
        paths, origin = [kubeconfig], "--kubeconfig"
    elif os.environ.get("KUBECONFIG"):
        paths = [p for p in os.environ["KUBECONFIG"].split(os.pathsep) if p]
        origin = "$KUBECONFIG"
    else:
        paths, origin = [os.path.expanduser("~/.kube/config")], "the default"
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


async def load_configuration(kubeconfig: str | None = None, *, context: str | None = None) -> Configuration:
    """A client configuration from ``kubeconfig`` (or $KUBECONFIG, ~/.kube/config), else in-cluster.

    An explicit ``kubeconfig`` wins; without one, a pod's service account is used when present.
    """
    configuration = Configuration()
    if kubeconfig is None and _in_cluster():
        kconfig.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        return configuration
    await kconfig.load_kube_config(
        config_file=kubeconfig, context=context, client_configuration=configuration, persist_config=False
    )
    return configuration


async def new_client(kubeconfig: str | None = None, *, context: str | None = None) -> ApiClient:
    """An ``ApiClient`` for the cluster named by ``kubeconfig`` (see :func:`load_configuration`)."""
    return client_for(await load_configuration(kubeconfig, context=context))


def _version() -> str:
    try:
        return metadata.version("dispatch")
    except metadata.PackageNotFoundError:
        return "0"


class _JsonClient(ApiClient):
    """The generated client, sending dict bodies as they are.

    Every body dispatch sends is a JSON document already (dicts, lists, strings, numbers: records
    are dumped in pydantic's JSON mode, times are formatted strings), which the generated client
    would copy, value by value, before encoding it: an eighth of the operator's CPU while it creates
    a thousand jobs (py-spy, BENCHMARKS.md). Its models (and anything else) still go its way; a dict
    holding anything json cannot encode fails loudly, in ``json.dumps``, before it is sent.
    """

    def sanitize_for_serialization(self, obj: Any) -> Any:
        if type(obj) is dict:
            return obj
        return super().sanitize_for_serialization(obj)


def client_for(configuration: Configuration) -> ApiClient:
    """An ``ApiClient`` for ``configuration`` that names dispatch as its user agent."""
    api = _JsonClient(configuration=configuration)
    api.user_agent = USER_AGENT.format(version=_version())
    return api


def _error(e: ApiException) -> ApiError:
    status = int(e.status or 0)
    message = _message(e)
    if status == 404:
        return NotFound(status, message)
    if status == 409:
        return Conflict(status, message)
    if status == 410:
        return Gone(status, message)
    return ApiError(status, message)


def _message(e: ApiException) -> str:
    try:
        body = json.loads(e.body) if e.body else {}
    except ValueError:
        body = {}
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    return f"{e.status} {e.reason}"


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: str
    """ADDED, MODIFIED, DELETED or BOOKMARK."""
    object: Body


class CustomObjects:
    """One custom resource (group, version, plural), namespaced. Defaults to DispatchJobs."""

    def __init__(
        self,
        api: ApiClient,
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
        self._custom = CustomObjectsApi(api)

    async def get(self, namespace: str, name: str) -> Body:
        try:
            body: Body = await self._custom.get_namespaced_custom_object(
                self.group, self.version, namespace, self.plural, name
            )
        except ApiException as e:
            raise _error(e) from None
        return body

    async def create(self, namespace: str, body: Mapping[str, Any]) -> Body:
        try:
            created: Body = await self._custom.create_namespaced_custom_object(
                self.group, self.version, namespace, self.plural, dict(body), field_manager=self.field_manager
            )
        except ApiException as e:
            raise _error(e) from None
        return created

    async def replace_status(self, namespace: str, name: str, body: Mapping[str, Any]) -> Body:
        """PUT ``/status``; ``body.metadata.resourceVersion`` is the precondition (409 when stale)."""
        try:
            replaced: Body = await self._custom.replace_namespaced_custom_object_status(
                self.group,
                self.version,
                namespace,
                self.plural,
                name,
                dict(body),
                field_manager=self.field_manager,
            )
        except ApiException as e:
            raise _error(e) from None
        return replaced

    async def merge_patch(self, namespace: str, name: str, patch: Mapping[str, Any]) -> Body:
        """A JSON merge patch of the object (not its status). Include metadata.resourceVersion for CAS."""
        try:
            patched: Body = await self._custom.patch_namespaced_custom_object(
                self.group,
                self.version,
                namespace,
                self.plural,
                name,
                dict(patch),
                field_manager=self.field_manager,
                **_MERGE,
            )
        except ApiException as e:
            raise _error(e) from None
        return patched

    async def delete(self, namespace: str, name: str) -> None:
        try:
            await self._custom.delete_namespaced_custom_object(
                self.group, self.version, namespace, self.plural, name
            )
        except ApiException as e:
            error = _error(e)
            if not isinstance(error, NotFound):
                raise error from None

    async def list(
        self, namespace: str | None = None, *, label_selector: str | None = None
    ) -> tuple[list[Body], str]:
        """Every object (in ``namespace``, or in all); returns the items and the list's resourceVersion.

        Read :data:`PAGE` objects at a time: one answer with 10,000 DispatchJobs took the API server
        longer than its 60 s handler timeout on this machine, so the list never completed."""
        items: list[Body] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"limit": PAGE}
            if label_selector:
                kwargs["label_selector"] = label_selector
            if token:
                kwargs["_continue"] = token
            result = await self._list_call(namespace, kwargs)  # 410 (continue expired): Gone
            items.extend(result.get("items") or [])
            meta = result.get("metadata") or {}
            token = meta.get("continue") or None
            if token is None:
                return items, str(meta.get("resourceVersion", ""))

    async def _list_call(self, namespace: str | None, kwargs: dict[str, Any]) -> Any:
        """The generated client's list of every namespace (None) or of one; ApiError on failure."""
        try:
            if namespace is None:
                return await self._custom.list_cluster_custom_object(
                    self.group, self.version, self.plural, **kwargs
                )
            return await self._custom.list_namespaced_custom_object(
                self.group, self.version, namespace, self.plural, **kwargs
            )
        except ApiException as e:
            raise _error(e) from None

    async def watch(
        self,
        namespace: str | None = None,
        *,
        resource_version: str | None = None,
        timeout_seconds: int = 300,
    ) -> AsyncIterator[WatchEvent]:
        """One watch request from ``resource_version``; ends when the server closes it.

        Raises :class:`Gone` when ``resource_version`` is too old (list again).
        """
        kwargs: dict[str, Any] = {
            "watch": True,
            "allow_watch_bookmarks": True,
            "timeout_seconds": timeout_seconds,
            "_preload_content": False,
        }
        if resource_version:
            kwargs["resource_version"] = resource_version
        response = await self._list_call(namespace, kwargs)
        async with response:
            async for line in _lines(response.content):
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


async def _lines(content: Any) -> AsyncIterator[bytes]:
    """Newline-delimited chunks of a streamed body, of any length (aiohttp's readline has a limit)."""
    buffer = b""
    async for chunk in content.iter_any():
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if line.strip():
                yield line
    if buffer.strip():
        yield buffer


async def watch_forever(
    objects: CustomObjects,
    namespace: str | None = None,
    *,
    retry_delay: float = 1.0,
    on_listed: Callable[[], None] | None = None,
) -> AsyncIterator[WatchEvent]:
    """List, then watch from the list's resourceVersion, re-listing on 410 and reconnecting on errors.

    Every object of the initial list (and of each re-list) is yielded as an ADDED event;
    ``on_listed()`` is called once the consumer has taken the last of them (the cache is whole).
    """
    resource_version: str | None = None
    while True:
        try:
            if resource_version is None:
                items, resource_version = await objects.list(namespace)
                for item in items:
                    yield WatchEvent("ADDED", item)
                del items
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

"""The kit's requests on the API server about one kind's objects and their pods, and its errors.

Every write that changes what the cache should show is handed to ``remember`` (the cache's own
writes, newer than the watch until the watch brings them back).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

from .._constants import (
    API_VERSION,
    GROUP,
    KIND,
    LABEL_JOB,
    LABEL_MANAGED_BY,
    LABEL_SUBMISSION,
    MANAGED_BY,
    OBJECT_FINALIZER,
    PLURAL,
    VERSION,
)
from .._errors import BackendError, TransientBackendError
from .._kubeclient import JSON_PATCH, Client, KubeError, request
from ._fields import owner_of
from ._kind import Kind
from ._mask import Body

SELECTOR: Final = f"{LABEL_MANAGED_BY}={MANAGED_BY}"

OwnerLookup = Callable[[Client, str, str], Awaitable[Mapping[str, Any] | None]]
"""``(api, namespace, job name) -> ownerReference`` for the objects of that job, or None for none."""

Remember = Callable[[str, str | None, Body], None]
"""``(object id, job or None, body written)``: our own write, for the cache to show."""


async def dispatchjob_owner(api: Client, namespace: str, name: str) -> Mapping[str, Any]:
    """The DispatchJob as the controlling owner: deleting it deletes its objects (the operator's
    default; a library user without the CRD passes ``owner=None``)."""
    path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}"
    try:
        found = await request(api, "GET", path)
    except KubeError as error:
        raise explain(error, f"GET DispatchJob {namespace}/{name}") from None
    uid = found.get("metadata", {}).get("uid")
    if not uid:
        raise BackendError(f"DispatchJob {namespace}/{name} has no uid")
    return {"apiVersion": API_VERSION, "kind": KIND, "name": name, "uid": uid, "controller": True}


def refused_for_good(error: KubeError) -> bool:
    """The API server (or an admission webhook, such as a controller's validator) refused the object
    itself: sending it again can only be refused again."""
    if error.status in (400, 413, 422):
        return True
    return error.status == 403 and "denied the request" in error.message


def split_id(value: str, what: str = "job") -> tuple[str, str]:
    namespace, sep, name = value.partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise BackendError(f"a Kubernetes {what} id is '<namespace>/<name>', not {value!r}")
    return namespace, name


def explain(error: KubeError, doing: str) -> BackendError:
    if error.status == 404:
        return BackendError(f"{doing}: not found ({error.message})")
    if error.status in (401, 403):
        return BackendError(f"{doing}: not allowed ({error.status} {error.reason}): {error.message}")
    if error.status == 422:
        return BackendError(f"{doing}: rejected as invalid: {error.message}")
    return BackendError(f"{doing}: {error.status} {error.reason}: {error.message}")


class ObjectApi:
    """Reads, deletes and the finalizer's removal for the objects of one kind, and their pods."""

    def __init__(self, kind: Kind, api: Client, remember: Remember) -> None:
        self.kind = kind
        self.api = api
        self.noun = kind.resource.kind
        self.remember = remember

    def path(self, namespace: str | None, name: str | None = None) -> str:
        return self.kind.resource.path(namespace, name)

    async def get(self, namespace: str, name: str) -> Body | None:
        try:
            return await request(self.api, "GET", self.path(namespace, name))
        except KubeError as error:
            if error.status == 404:
                return None
            raise explain(error, f"read {self.noun} {namespace}/{name}") from None

    async def list_query(self, path: str, query: Mapping[str, object]) -> Body:
        try:
            return await request(self.api, "GET", path, query=query)
        except KubeError as error:
            raise explain(error, f"list {path}") from None

    async def let_go(self, namespace: str, name: str, body: Body | None) -> None:
        """Remove dispatch's finalizer (a JSON patch with a test, so no other finalizer is touched)."""
        for attempt in range(5):
            if body is None or attempt:
                body = await self.get(namespace, name)
                if body is None:
                    return
            finalizers = list(body.get("metadata", {}).get("finalizers") or ())
            if OBJECT_FINALIZER not in finalizers:
                return
            at = f"/metadata/finalizers/{finalizers.index(OBJECT_FINALIZER)}"
            patch = [{"op": "test", "path": at, "value": OBJECT_FINALIZER}, {"op": "remove", "path": at}]
            try:
                patched = await request(
                    self.api, "PATCH", self.path(namespace, name), body=patch, content_type=JSON_PATCH
                )
            except KubeError as error:
                if error.status == 404:
                    return
                if error.status in (409, 422):
                    continue  # the list changed since read: read again
                raise explain(error, f"remove the finalizer of {self.noun} {namespace}/{name}") from None
            self.remember(f"{namespace}/{name}", None, patched)
            return
        raise TransientBackendError(
            f"remove the finalizer of {self.noun} {namespace}/{name}: it kept changing"
        )

    async def delete(self, namespace: str, name: str) -> None:
        try:
            deleted = await request(
                self.api, "DELETE", self.path(namespace, name), query={"propagationPolicy": "Background"}
            )
        except KubeError as error:
            if error.status != 404:
                raise explain(error, f"delete {self.noun} {namespace}/{name}") from None
            return
        meta = deleted.get("metadata") or {}
        if meta.get("deletionTimestamp") and OBJECT_FINALIZER in (meta.get("finalizers") or ()):
            # Held by our finalizer (a stopped queued object): shown retained at once, not when the
            # watch brings it, so the job is not recorded settled before an End lets go of it (the
            # object would stay, its Workload with it, and Kueue admitted it again).
            self.remember(f"{namespace}/{name}", None, deleted)

    async def delete_pod(self, namespace: str, name: str) -> None:
        try:
            await request(self.api, "DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}")
        except KubeError as error:
            if error.status != 404:
                raise explain(error, f"delete pod {namespace}/{name}") from None

    async def delete_pods(
        self, namespace: str, name: str, body: Body | None, *, grace_seconds: int | None = None
    ) -> None:
        """Delete the pods of an object by its labels (job and submission), the object gone or not;
        with ``grace_seconds``, that grace instead of the pods' own (a deletion may shorten a grace
        the garbage collector's deletion of the object's pods began)."""
        owner = owner_of(body) if body is not None else None
        if owner is not None:
            job_name, n = owner[0].split("/", 1)[1], owner[1]
        else:
            job_name, _, tail = name.rpartition("-")
            if not job_name or not tail.isdigit():
                return
            n = int(tail)
        selector = f"{LABEL_JOB}={job_name},{LABEL_SUBMISSION}={n}"
        query = {"labelSelector": selector}
        if grace_seconds is not None:
            query["gracePeriodSeconds"] = str(grace_seconds)
        try:
            await request(self.api, "DELETE", f"/api/v1/namespaces/{namespace}/pods", query=query)
        except KubeError as error:
            if error.status != 404:
                raise explain(error, f"delete the pods of {self.noun} {namespace}/{name}") from None

"""The release of an unqueued object as one JSON patch whose tests are its preconditions.

A release must never unsuspend an object that dispatch has stopped (``dispatch.dev/ended``), that
is being deleted, or that something else already released. A merge patch carrying the
resourceVersion read says so too, but also fails on every write the precondition does not care
about: a controller's status update right after the create often lands between the read and the
release, and each such 409 costs a read and a second turn. The API server applies a JSON patch
to the object as it is when the write lands (retrying its own conflicts), so ``test`` operations
on exactly those fields are the precondition, and a status update no longer fails it.

A ``test`` with the value ``null`` passes when the member is absent (evanphx/json-patch v4, the
API server's: ``if val == nil { if op.value() == nil || op.value().raw == nil { return nil } }``).
A failed test is answered 422.

A queued object is released into Kueue's queue instead, by one merge patch conditional on the
resourceVersion (:func:`~._kueue.release_patch`), and stays suspended: Kueue starts it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from .._constants import ANNOTATION_ENDED, ANNOTATION_RELEASED
from .._errors import TransientBackendError
from .._kubeclient import JSON_PATCH, MERGE_PATCH, KubeError, request
from ._cache import Cache
from ._fence import Fence
from ._fields import owner_of
from ._kind import Kind
from ._kueue import queue_of, release_patch, whole_for_release
from ._mask import Body
from ._requests import ObjectApi, explain, split_id


def pointer(*keys: str) -> str:
    """The JSON pointer (RFC 6901) of ``keys``."""
    return "".join("/" + k.replace("~", "~0").replace("/", "~1") for k in keys)


def _leaves(patch: Mapping[str, Any], at: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    for key, value in patch.items():
        if isinstance(value, Mapping):
            yield from _leaves(value, (*at, key))
        else:
            yield (*at, key), value


def release_ops(kind: Kind, body: Mapping[str, Any], released_at: str) -> list[Body]:
    """The JSON patch that releases ``body`` (an unqueued held object of ``kind``) if, when it lands,
    it is still held, not ended by dispatch and not being deleted; a 422 otherwise."""
    meta = body.get("metadata") or {}
    ops: list[Body] = [
        {"op": "test", "path": pointer("metadata", "deletionTimestamp"), "value": None},
    ]
    if meta.get("annotations"):
        ops += [
            {"op": "test", "path": pointer("metadata", "annotations", ANNOTATION_ENDED), "value": None},
            {
                "op": "add",
                "path": pointer("metadata", "annotations", ANNOTATION_RELEASED),
                "value": released_at,
            },
        ]
    else:  # no map to add to: add it, unless one appeared since (a stop's annotation: the test fails)
        ops += [
            {"op": "test", "path": pointer("metadata", "annotations"), "value": None},
            {
                "op": "add",
                "path": pointer("metadata", "annotations"),
                "value": {ANNOTATION_RELEASED: released_at},
            },
        ]
    ops += [
        {"op": "test", "path": pointer(*path), "value": held}
        for path, held in _leaves(kind.suspend_patch(True))
    ]
    ops += [
        {"op": "replace", "path": pointer(*path), "value": v}
        for path, v in _leaves(kind.suspend_patch(False))
    ]
    return ops


@dataclass(eq=False)
class Releaser:
    """Releases one held object: after the fence, by the JSON patch above or Kueue's merge patch."""

    kind: Kind
    objects: ObjectApi
    cache: Cache
    fence: Fence
    clock: Callable[[], float]
    log: logging.Logger

    async def release(self, object_id: str) -> None:
        namespace, name = split_id(object_id, "object")
        body = self.cache.current(object_id)
        if body is None:
            body = await self.objects.get(namespace, name)
            if body is None:
                self.log.info("release %s: it no longer exists", object_id)
                return
            self.cache.remember(object_id, None, body)
        owner = owner_of(body)
        if owner is not None:
            # Invariant 1 without waiting on the hot path: the older objects of the job are stopped
            # on the API server before this one may start (usually the stop landed long ago).
            await self.fence.hold(owner[0], owner[1], object_id)
            body = self.cache.current(object_id)
        refused = False
        for _ in range(5):
            if body is None or (queue_of(body) is not None and whole_for_release(self.kind)):
                body = await self.objects.get(namespace, name)  # whole: the cache keeps a projection
                if body is None:
                    self.log.info("release %s: it no longer exists", object_id)
                    return
            now = datetime.fromtimestamp(self.clock(), UTC).isoformat()
            # A queued object is released into Kueue's queue and stays suspended: Kueue starts it.
            patch = release_patch(body, now, self.kind)
            if not self._releasable(body, queued=patch is not None):
                return  # already released, or ended: never unsuspend what dispatch has stopped
            # Unqueued: a JSON patch whose tests are the preconditions, so the controller's status
            # update after the create does not make it fail; queued: a merge patch conditional on
            # the resourceVersion (Kueue's labels, a whole runtimePatches list).
            ops = release_ops(self.kind, body, now) if patch is None else None
            try:
                patched = await request(
                    self.objects.api,
                    "PATCH",
                    self.objects.path(namespace, name),
                    body=ops if ops is not None else patch,
                    content_type=JSON_PATCH if ops is not None else MERGE_PATCH,
                )
            except KubeError as error:
                if error.status == 404:
                    return
                if error.status == 409 or (error.status == 422 and ops is not None and not refused):
                    # Changed since read (409), or a test failed (422): read again and decide again
                    # (a second 422 with every precondition holding is not a test: it is raised).
                    refused = refused or error.status == 422
                    body = None
                    continue
                raise explain(error, f"release {self.objects.noun} {object_id}") from None
            self.cache.remember(object_id, None, patched)
            self.cache.state(object_id).released_at = self.clock()
            return
        raise TransientBackendError(f"release {object_id}: it kept changing under us")

    def _releasable(self, body: Body, *, queued: bool) -> bool:
        """Still held, not ended by dispatch, not being deleted, and (queued) not released yet."""
        annotations = body.get("metadata", {}).get("annotations") or {}
        return not (
            annotations.get(ANNOTATION_ENDED)
            or not self.kind.suspended(body)
            or body["metadata"].get("deletionTimestamp")
            or (queued and annotations.get(ANNOTATION_RELEASED))
        )

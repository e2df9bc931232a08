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
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from .._constants import ANNOTATION_ENDED, ANNOTATION_RELEASED
from ._kind import Kind
from ._mask import Body


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

"""What the kit keeps of each object, pod and Event: the masks its readers need, and their projections.

The cache holds these projections, never whole bodies; a field a reader looks at but no mask names
is absent (tests/unit/test_projection.py compares both on every recorded event).
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any, Final

from .._constants import (
    GROUP,
    LABEL_MANAGED_BY,
)
from ._fields import MAX_DETAIL
from ._kind import Kind
from ._mask import CONDITION, SHARED, Body, Clip, Mask, Prefixed, conditions, merge, project

KEPT_PREFIXES: Final = (f"{GROUP}/", LABEL_MANAGED_BY, "kueue.x-k8s.io/")
"""The labels and annotations the kit keeps: dispatch's own, and Kueue's (its queue and priority)."""
METADATA: Final[Mapping[str, Mask]] = {
    "name": True,
    "namespace": SHARED,
    "uid": True,
    "resourceVersion": True,
    "creationTimestamp": True,
    "deletionTimestamp": True,
    "finalizers": (SHARED,),
    "labels": Prefixed(KEPT_PREFIXES),
    "annotations": Prefixed(KEPT_PREFIXES),
}
"""What the kit reads of an object's metadata: its id, the owner labels, the annotations it
writes and reads back, the finalizer it removes, the precondition of its patches; a pod's is the
part named in :data:`POD`. ``uid``: what Kueue's Workloads name as their owner."""
_TERMINATED: Final[Mask] = {
    "reason": SHARED,
    "exitCode": True,
    "signal": True,
    "message": Clip(MAX_DETAIL),
    "startedAt": True,
}
POD: Final[Mask] = {
    "metadata": {
        k: METADATA[k] for k in ("name", "namespace", "uid", "resourceVersion", "deletionTimestamp", "labels")
    },
    "spec": {"nodeName": SHARED},
    "status": {
        "phase": SHARED,
        "reason": SHARED,
        "message": Clip(MAX_DETAIL),
        "startTime": True,
        "conditions": conditions(
            "DisruptionTarget",
            "PodScheduled",
            mask={**CONDITION, "lastTransitionTime": True},
        ),
        "containerStatuses": (
            {
                "name": SHARED,
                "restartCount": True,
                "state": {
                    "terminated": _TERMINATED,
                    "waiting": {"reason": SHARED, "message": True},
                    "running": {"startedAt": True},
                },
                "lastState": {"terminated": _TERMINATED},
            },
        ),
    },
}
"""What :func:`pod_evidence` and the kinds' ``restarts`` read of a pod: its conditions, its
containers' states (every container's: the first one stands in when the kind's is missing), its
node; and when it began running (its containers' ``startedAt``, its ``startTime``). Messages
only ever shown in a cause's detail are cut to the detail's length."""


_OBJECT_MASKS: weakref.WeakKeyDictionary[Kind, Mask] = weakref.WeakKeyDictionary()


def object_shape(kind: Kind) -> Mask:
    """What the kit caches of one object of ``kind``: the kind's own :attr:`Kind.projection`, the
    metadata, when its controller started it (``status.startTime``) and who owns its suspend field
    (``managedFields``, for :func:`held_outside`).

    One mask per kind (cached, never to be changed): :func:`~._mask.project` keeps each
    mask's compiled projector for the life of the process, so a new mask for every backend
    would add one more for every backend made."""
    mask = _OBJECT_MASKS.get(kind)
    if mask is None:
        mask = _OBJECT_MASKS[kind] = _object_mask(kind)
    return mask


def _object_mask(kind: Kind) -> Mask:
    path: list[str] = []
    step: Any = kind.suspend_patch(True)
    while isinstance(step, dict) and len(step) == 1:
        key = next(iter(step))
        path.append(f"f:{key}")
        step = step[key]
    fields: Mask = True
    for key in reversed(path):
        fields = {key: fields}
    managed: Mask = ({"manager": SHARED, "time": True, "fieldsV1": fields},)
    kit: Mask = {"metadata": {**METADATA, "managedFields": managed}, "status": {"startTime": True}}
    return merge(kit, kind.projection)


def project_object(mask: Mask, body: Body) -> Body:
    """``body`` as the kit caches it (``mask`` from :func:`object_shape`); managedFields entries
    that own nothing of the suspend field are left out (:func:`held_outside` skips them)."""
    kept: Body = project(body, mask)
    meta = kept.get("metadata")
    if not isinstance(meta, dict):
        return kept
    managed = meta.get("managedFields")
    if isinstance(managed, list) and any(isinstance(e, dict) and not e.get("fieldsV1") for e in managed):
        owning = [e for e in managed if not isinstance(e, dict) or e.get("fieldsV1")]
        kept = {**kept, "metadata": {**meta, "managedFields": owning}}
    return kept


def project_pod(pod: Body) -> Body:
    """``pod`` as the kit caches it (:data:`POD`)."""
    kept: Body = project(pod, POD)
    return kept


EVENT: Final[Mapping[str, Mask]] = {
    "metadata": {"name": True, "namespace": SHARED, "creationTimestamp": True},
    "involvedObject": {"kind": SHARED, "name": True},
    "reason": SHARED,
    "message": Clip(MAX_DETAIL),
    "lastTimestamp": True,
    "eventTime": True,
    "firstTimestamp": True,
}
"""What the kit keeps of a disruption Event (its watch's index): what :func:`event_evidence` reads.
The message is only ever shown in a cause's detail, cut to the detail's length."""


def project_event(event: Body) -> Body:
    """``event`` as the kit's index keeps it (:data:`EVENT`)."""
    kept: Body = project(event, EVENT)
    return kept

"""From a workload object and its pods to an :class:`~dispatch.ObjectView`: phase, cause, restarts.

Pure functions, no I/O: the clock and what is known about nodes are passed in; what differs between
kinds comes from the :class:`~dispatch._workload.Kind`.

The cause comes from the most precise signal. Pods say more than the object: controllers do not
look at a pod's ``DisruptionTarget`` condition (or only to count it), and their ``Failed`` condition
says little more than that replicas failed. So the pods are read first (disruption, termination
reason, exit code, waiting reason, scheduling), then the object's own status (the kind's
:meth:`~dispatch._workload.Kind.outcome`), and ``unknown`` is what is left.
When several pods have something to say, the cause first in dispatch's order wins (a preempted
master explains the workers' non-zero exits, an OOM explains a NCCL timeout elsewhere).
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from .._constants import (
    ANNOTATION_ENDED,
    ANNOTATION_NO_CAPACITY_AFTER,
    ANNOTATION_RELEASED,
    ANNOTATION_RESTART_BUDGET,
    GROUP,
    LABEL_JOB,
    LABEL_MANAGED_BY,
    LABEL_SUBMISSION,
    OBJECT_FINALIZER,
    REPORTING_COMPONENT,
)
from .._model import Cause, CauseKind, ObjectView, Phase
from ._kind import CONDITION, SHARED, Body, Clip, Kind, Mask, Prefixed, conditions, merge, project
from ._kueue import WorkloadView, queued_verdict

DEFAULT_NO_CAPACITY_AFTER: Final = 300
WAITING_AFTER: Final = 5.0
"""Seconds a pod stays unschedulable before status names it (:func:`waiting_note`): a preemptor
waiting for its victims to go, or a node on its way, passes without a status write."""
_RANK: Final = {kind: i for i, kind in enumerate(CauseKind)}
_MAX_DETAIL: Final = 1024

PREEMPTION_REASONS: Final = frozenset(
    {"PreemptionByScheduler", "PreemptionByKubeScheduler", "EvictionByEvictionAPI"}
)
NODE_LOSS_REASONS: Final = frozenset({"DeletionByTaintManager", "DeletionByPodGC"})
KUBELET_TERMINATION: Final = "TerminationByKubelet"
LAUNCH_ERRORS: Final = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "ErrImageNeverPull",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
        "PreCreateHookError",
        "PreStartHookError",
    }
)
LAUNCH_TERMINATIONS: Final = frozenset({"ContainerCannotRun", "StartError"})
POD_NODE_LOST_REASONS: Final = frozenset({"NodeLost", "NodeShutdown", "Shutdown", "Terminated"})

POD_EVENTS: Final = (
    ("Pod", "Preempted"),
    ("Pod", "TaintManagerEviction"),
    ("Pod", "Evicted"),
)
"""(involvedObject.kind, reason) of the events that outlive a pod and say why it ended: kube-scheduler's
``Preempted by pod <uid> on node <node>``, the taint-eviction controller's ``Marking for deletion Pod
<ns>/<name>``, the kubelet's node-pressure ``Evicted``; with the kind's ``create_failure_reason`` on
the object (its controller's ``Error creating: ...`` when the API server refuses its pods)."""


def evidence_events(kind: Kind) -> tuple[tuple[str, str], ...]:
    return (*POD_EVENTS, (kind.resource.kind, kind.create_failure_reason))


_REFUSED_POD_MARKS: Final = ("is invalid", "is forbidden: violates", "denied the request")
"""FailedCreatePod messages that will never change (quota or a missing ServiceAccount might)."""


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
_TERMINATED: Final[Mask] = {"reason": SHARED, "exitCode": True, "message": Clip(_MAX_DETAIL)}
POD: Final[Mask] = {
    "metadata": {
        k: METADATA[k] for k in ("name", "namespace", "uid", "resourceVersion", "deletionTimestamp", "labels")
    },
    "spec": {"nodeName": SHARED},
    "status": {
        "phase": SHARED,
        "reason": SHARED,
        "message": Clip(_MAX_DETAIL),
        "conditions": conditions(
            "DisruptionTarget",
            "PodScheduled",
            shape={**CONDITION, "lastTransitionTime": True},
        ),
        "containerStatuses": (
            {
                "name": SHARED,
                "restartCount": True,
                "state": {"terminated": _TERMINATED, "waiting": {"reason": SHARED, "message": True}},
                "lastState": {"terminated": _TERMINATED},
            },
        ),
    },
}
"""What :func:`pod_evidence` and the kinds' ``restarts`` read of a pod: its conditions, its
containers' states (every container's: the first one stands in when the kind's is missing), its
node. Messages only ever shown in a cause's detail are cut to the detail's length."""


_OBJECT_SHAPES: weakref.WeakKeyDictionary[Kind, Mask] = weakref.WeakKeyDictionary()


def object_shape(kind: Kind) -> Mask:
    """What the kit caches of one object of ``kind``: the kind's own :attr:`Kind.projection`, the
    metadata, when its controller started it (``status.startTime``) and who owns its suspend field
    (``managedFields``, for :func:`held_outside`).

    One shape object per kind (cached, never to be changed): :func:`~._kind.project` keeps each
    shape's compiled projector for the life of the process, so a new shape for every backend
    would add one more for every backend made."""
    shape = _OBJECT_SHAPES.get(kind)
    if shape is None:
        shape = _OBJECT_SHAPES[kind] = _object_shape(kind)
    return shape


def _object_shape(kind: Kind) -> Mask:
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


def project_object(shape: Mask, body: Body) -> Body:
    """``body`` as the kit caches it (``shape`` from :func:`object_shape`); managedFields entries
    that own nothing of the suspend field are left out (:func:`held_outside` skips them)."""
    kept: Body = project(body, shape)
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


@dataclass(frozen=True, slots=True)
class Evidence:
    cause: Cause
    terminal: bool
    """True when the object cannot go on; False for a restart in place (OnFailure)."""


@dataclass(frozen=True, slots=True)
class Verdict:
    view: ObjectView
    stop: Cause | None = None
    """The adapter must stop the object itself (the scheduler would go on): record this cause."""
    stop_after_grace: bool = False
    """The scheduler ends it by itself too, normally: the stop waits the adapter's grace first."""
    recheck_at: float | None = None
    """A wall-clock time (epoch seconds) at which the verdict may change with no event."""


def object_id(body: Mapping[str, Any]) -> str:
    meta = body.get("metadata", {})
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def owner_of(body: Mapping[str, Any]) -> tuple[str, int] | None:
    """(job id, submission) from dispatch's labels, or None when they are missing or malformed."""
    meta = body.get("metadata", {})
    labels = meta.get("labels") or {}
    name, n = labels.get(LABEL_JOB), labels.get(LABEL_SUBMISSION)
    if not name or not n:
        return None
    try:
        submission = int(n)
    except ValueError:
        return None
    return f"{meta.get('namespace', '')}/{name}", submission


def no_capacity_after(body: Mapping[str, Any]) -> int:
    raw = (body.get("metadata", {}).get("annotations") or {}).get(ANNOTATION_NO_CAPACITY_AFTER)
    try:
        return int(raw) if raw is not None else DEFAULT_NO_CAPACITY_AFTER
    except ValueError:
        return DEFAULT_NO_CAPACITY_AFTER


def restart_budget(body: Mapping[str, Any]) -> int | None:
    raw = (body.get("metadata", {}).get("annotations") or {}).get(ANNOTATION_RESTART_BUDGET)
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def ended_annotation(cause: Cause) -> str:
    return json.dumps(cause.model_dump(mode="json", exclude_none=True), separators=(",", ":"))


def parse_time(value: object) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def detail(*parts: object) -> str:
    text = ": ".join(str(p) for p in parts if p not in (None, ""))
    return text[:_MAX_DETAIL]


def _container(pod: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    statuses = pod.get("status", {}).get("containerStatuses") or []
    for status in statuses:
        if status.get("name") == name:
            return dict(status)
    return dict(statuses[0]) if statuses else {}


def container_restarts(pod: Mapping[str, Any], container: str = "") -> int:
    """The training container's restartCount: the in-place restarts of this pod."""
    return int(_container(pod, container).get("restartCount") or 0)


def _conditions(obj: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {c.get("type", ""): c for c in obj.get("status", {}).get("conditions") or []}


def _termination_cause(pod_name: str, term: Mapping[str, Any]) -> Cause | None:
    """The cause a container termination states, or None for a clean exit."""
    reason = term.get("reason") or ""
    code = term.get("exitCode")
    exit_code = code if isinstance(code, int) else None
    message = term.get("message") or ""
    if reason == "OOMKilled":
        return Cause(
            kind=CauseKind.OUT_OF_MEMORY,
            detail=detail(f"pod {pod_name}", reason, message),
            exit_code=exit_code,
        )
    if reason == "DeadlineExceeded":
        return Cause(
            kind=CauseKind.TIME_LIMIT, detail=detail(f"pod {pod_name}", reason, message), exit_code=exit_code
        )
    if reason in LAUNCH_TERMINATIONS:
        return Cause(
            kind=CauseKind.LAUNCH_FAILED,
            detail=detail(f"pod {pod_name}", reason, message),
            exit_code=exit_code,
        )
    if exit_code:
        return Cause(
            kind=CauseKind.NON_ZERO_EXIT,
            detail=detail(f"pod {pod_name}", f"exited with code {exit_code}", reason, message),
            exit_code=exit_code,
        )
    return None


def pod_evidence(
    pod: Mapping[str, Any],
    *,
    restarts_in_place: bool,
    now: float,
    no_capacity_after_seconds: int,
    gone_nodes: Container[str] = (),
    container: str = "",
) -> tuple[Evidence | None, float | None]:
    """What one pod says about why its object ended (or restarted), and when to look again."""
    meta = pod.get("metadata", {})
    name = meta.get("name", "?")
    status = pod.get("status", {})
    phase = status.get("phase")
    conditions = _conditions(pod)
    status_of = _container(pod, container)
    state = status_of.get("state") or {}
    term = state.get("terminated")
    code = (term or {}).get("exitCode")
    exit_code = code if isinstance(code, int) else None

    disruption = conditions.get("DisruptionTarget")
    if disruption is not None and disruption.get("status") == "True":
        reason = disruption.get("reason") or ""
        message = disruption.get("message") or ""
        node = pod.get("spec", {}).get("nodeName") or ""
        if reason in NODE_LOSS_REASONS:
            kind = CauseKind.NODE_LOST
        elif reason == KUBELET_TERMINATION:
            lost = (node and node in gone_nodes) or "shutdown" in message.lower()
            kind = CauseKind.NODE_LOST if lost else CauseKind.PREEMPTED
        else:  # PREEMPTION_REASONS, and any disruption Kubernetes adds later
            kind = CauseKind.PREEMPTED
        text = detail(f"pod {name}", reason, message, f"node {node}" if node else "")
        return Evidence(Cause(kind=kind, detail=text, exit_code=exit_code), terminal=True), None

    node = pod.get("spec", {}).get("nodeName") or ""
    if node and node in gone_nodes and needs_node(pod):
        text = detail(f"pod {name}", "deleted while its node is lost (NotReady or gone)", f"node {node}")
        return Evidence(Cause(kind=CauseKind.NODE_LOST, detail=text, exit_code=exit_code), True), None

    pod_reason = status.get("reason") or ""
    pod_message = status.get("message") or ""
    if pod_reason == "Evicted":
        return Evidence(
            Cause(
                kind=CauseKind.PREEMPTED,
                detail=detail(f"pod {name}", pod_reason, pod_message),
                exit_code=exit_code,
            ),
            True,
        ), None
    if pod_reason in POD_NODE_LOST_REASONS:
        return Evidence(
            Cause(
                kind=CauseKind.NODE_LOST,
                detail=detail(f"pod {name}", pod_reason, pod_message),
                exit_code=exit_code,
            ),
            True,
        ), None
    if pod_reason == "DeadlineExceeded":
        return Evidence(
            Cause(
                kind=CauseKind.TIME_LIMIT,
                detail=detail(f"pod {name}", pod_reason, pod_message),
                exit_code=exit_code,
            ),
            True,
        ), None

    # A pod being deleted is stopped by its deletion (SIGTERM, then SIGKILL: 143 or 137 "Error"):
    # that exit says who deleted it, not why the object ended. The training operator deletes every
    # pod at its backoff limit or on suspend, cleanPodPolicy deletes the running ones once the job
    # failed; a disruption, a lost node or a specific reason (OOMKilled) still count.
    deleting = bool(meta.get("deletionTimestamp"))
    if term is not None and phase != "Succeeded":
        cause = _termination_cause(name, term)
        if cause is not None and not (deleting and cause.kind is CauseKind.NON_ZERO_EXIT):
            # Under OnFailure the kubelet restarts the container; the pod fails only for pod-level reasons.
            return Evidence(cause, terminal=not restarts_in_place or phase == "Failed"), None
    last = (status_of.get("lastState") or {}).get("terminated")
    if last is not None:
        cause = _termination_cause(name, last)
        if cause is not None:
            # Restarted in place by the kubelet: a restart under the native rule, or else (pods
            # built with restartPolicy OnFailure by a runtime dispatch does not control) an end no
            # rule of the plan asked to restart: the kit stops the object on it.
            return Evidence(cause, terminal=not restarts_in_place), None

    waiting = state.get("waiting") or {}
    if waiting.get("reason") in LAUNCH_ERRORS:
        text = detail(f"pod {name}", waiting.get("reason"), waiting.get("message"))
        return Evidence(Cause(kind=CauseKind.LAUNCH_FAILED, detail=text), terminal=True), None
    if pod_reason.startswith("OutOf") or pod_reason in ("UnexpectedAdmissionError", "NodeAffinity"):
        return Evidence(
            Cause(kind=CauseKind.LAUNCH_FAILED, detail=detail(f"pod {name}", pod_reason, pod_message)), True
        ), None

    if phase == "Failed" and not deleting:
        text = detail(f"pod {name}", "failed", pod_reason, pod_message)
        return Evidence(Cause(kind=CauseKind.UNKNOWN, detail=text, exit_code=exit_code), terminal=True), None

    unplaced = unschedulable(pod, now=now)
    if unplaced is not None:
        since, message = unplaced
        deadline = since + no_capacity_after_seconds
        if now >= deadline:
            text = detail(f"pod {name}", f"unschedulable for more than {no_capacity_after_seconds}s", message)
            return Evidence(Cause(kind=CauseKind.NO_CAPACITY, detail=text), terminal=True), None
        return None, deadline
    return None, None


def unschedulable(pod: Mapping[str, Any], *, now: float) -> tuple[float, str] | None:
    """Since when kube-scheduler has found no node for a pending pod, and what it said, or None."""
    if pod.get("status", {}).get("phase") != "Pending":
        return None  # before the conditions: classify asks this of every running pod at every turn
    scheduled = _conditions(pod).get("PodScheduled")
    if scheduled is None or scheduled.get("status") != "False" or scheduled.get("reason") != "Unschedulable":
        return None
    return parse_time(scheduled.get("lastTransitionTime")) or now, str(scheduled.get("message") or "")


def waiting_note(
    pod: Mapping[str, Any], *, now: float, no_capacity_after_seconds: int
) -> tuple[str, float | None]:
    """What status says of a pod no node can take, once it has waited :data:`WAITING_AFTER`, and
    when to look again for it to be due. Deterministic in the pod (no "for N seconds"), so a
    restarted operator computes the same note and writes nothing."""
    unplaced = unschedulable(pod, now=now)
    if unplaced is None:
        return "", None
    since, message = unplaced
    if now < since + WAITING_AFTER:
        return "", since + WAITING_AFTER
    at = datetime.fromtimestamp(since + no_capacity_after_seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    name = pod.get("metadata", {}).get("name", "?")
    return detail(f"pod {name} unschedulable (no-capacity at {at})", message), None


def node_ready(node: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in node.get("status", {}).get("conditions") or []
    )


def needs_node(pod: Mapping[str, Any]) -> bool:
    """Whether the pod's cause depends on its node being lost: a kubelet-initiated termination, or a
    deletion nobody explains (no ``DisruptionTarget``), which on a NotReady node no kubelet confirms."""
    if not pod.get("spec", {}).get("nodeName"):
        return False
    disruption = _conditions(pod).get("DisruptionTarget")
    if disruption is not None and disruption.get("status") == "True":
        return disruption.get("reason") == KUBELET_TERMINATION
    # Any phase but Succeeded: a pod deleted on a NotReady node is still marked Failed by its
    # deletion's termination (recording notready-deleted), without saying why.
    deleting = bool(pod.get("metadata", {}).get("deletionTimestamp"))
    return deleting and pod.get("status", {}).get("phase") != "Succeeded"


def _event_time(event: Mapping[str, Any]) -> float | None:
    for value in (
        event.get("lastTimestamp"),
        event.get("eventTime"),
        event.get("firstTimestamp"),
        (event.get("metadata") or {}).get("creationTimestamp"),
    ):
        at = parse_time(value)
        if at is not None:
            return at
    return None


EVENT: Final[Mapping[str, Mask]] = {
    "metadata": {"name": True, "namespace": SHARED, "creationTimestamp": True},
    "involvedObject": {"kind": SHARED, "name": True},
    "reason": SHARED,
    "message": Clip(_MAX_DETAIL),
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


def event_objects(kind: Kind, event: Mapping[str, Any]) -> tuple[str, ...]:
    """The names the object an Event is about may have: its own for the kind's event; for a pod's,
    each leading part of the pod's name that ends in ``-<number>`` (objects are named
    ``<job>-<submission>`` and their pods after them), so that the pod's object is found by name
    without scanning. :func:`event_about` then says which (if any) it really is."""
    involved = event.get("involvedObject") or {}
    name = str(involved.get("name") or "")
    if involved.get("kind") == kind.resource.kind:
        return (name,) if name else ()
    if involved.get("kind") != "Pod":
        return ()
    found: list[str] = []
    at = name.find("-")
    while at > 0:
        head = name[:at]
        if "-" in head and head.rpartition("-")[2].isdigit():
            found.append(head)
        at = name.find("-", at + 1)
    return tuple(found)


def event_about(kind: Kind, body: Mapping[str, Any], event: Mapping[str, Any]) -> bool:
    """Whether ``event`` is about ``body`` or one of its pods, and from after ``body`` was created:
    the events of an older object of the same name cannot explain this one. (Not
    ``status.startTime``: when its pods are refused a controller may never write a status after
    the resume.)"""
    meta = body.get("metadata", {})
    name = meta.get("name", "")
    start = parse_time(meta.get("creationTimestamp"))
    if not name or start is None:
        return False
    at = _event_time(event)
    if at is None or at < start:
        return False
    involved = event.get("involvedObject") or {}
    target = involved.get("name") or ""
    if involved.get("kind") == "Pod":
        return bool(target.startswith(kind.pod_prefixes(dict(body))))
    return involved.get("kind") == kind.resource.kind and target == name


def event_evidence(
    kind: Kind, body: Mapping[str, Any], events: Iterable[Mapping[str, Any]]
) -> Evidence | None:
    """What Kubernetes' events say about why the pods of ``body`` ended (pods that may be gone).

    Only events about it from after its creation count (:func:`event_about`)."""
    found: list[Evidence] = []
    for event in events:
        if not event_about(kind, body, event):
            continue
        involved = event.get("involvedObject") or {}
        reason = event.get("reason") or ""
        message = event.get("message") or ""
        target = involved.get("name") or ""
        if involved.get("kind") == "Pod":
            if reason == "Preempted":
                cause = CauseKind.PREEMPTED
            elif reason == "TaintManagerEviction" and message.startswith("Marking for deletion"):
                cause = CauseKind.NODE_LOST
            elif reason == "Evicted":
                cause = CauseKind.PREEMPTED
            else:
                continue
            text = detail(f"pod {target}", reason, message, "from its event")
            found.append(Evidence(Cause(kind=cause, detail=text), terminal=True))
        elif reason == kind.create_failure_reason and any(mark in message for mark in _REFUSED_POD_MARKS):
            text = detail(f"the {kind.resource.kind} controller cannot create its pods", message)
            found.append(Evidence(Cause(kind=CauseKind.LAUNCH_FAILED, detail=text), terminal=True))
    return best(found)


def kind_evidence(
    kind: Kind,
    body: Body,
    pod: Mapping[str, Any],
    *,
    now: float,
    gone_nodes: Container[str] = (),
) -> tuple[Evidence | None, float | None]:
    """:func:`pod_evidence` for a pod of ``body``: a pod failure its controller answers by itself
    under the native rule (:meth:`Kind.recovers`) is a restart, not the end of the object."""
    restarts_in_place = kind.in_place(body)
    found, at = pod_evidence(
        pod,
        restarts_in_place=restarts_in_place,
        now=now,
        no_capacity_after_seconds=no_capacity_after(body),
        gone_nodes=gone_nodes,
        container=kind.container,
    )
    if found is not None and found.terminal and restarts_in_place and kind.recovers(body, found.cause):
        found = Evidence(found.cause, terminal=False)
    return found, at


def best(evidence: Iterable[Evidence]) -> Evidence | None:
    """The evidence whose cause comes first in dispatch's order of causes."""
    return min(evidence, key=lambda e: _RANK[e.cause.kind], default=None)


def classify(
    kind: Kind,
    body: Body,
    pods: Iterable[Mapping[str, Any]],
    *,
    now: float,
    gone_nodes: Container[str] = (),
    retained: Evidence | None = None,
    last_restart: Cause | None = None,
    restarts_seen: int = 0,
    workload: WorkloadView | None = None,
) -> Verdict:
    """The view of one object from its body, its pods and what was seen of pods already gone, and
    for a queued job's object its Kueue Workload (``workload``, see ``dispatch._workload._kueue``).

    ``restarts_seen``: the in-place restarts the adapter counted over every incarnation of the
    object's pods (a recreated pod starts again from 0)."""
    owner = owner_of(body)
    job, submission = owner if owner is not None else ("", 0)
    oid = object_id(body)
    meta = body.get("metadata", {})
    annotations = meta.get("annotations") or {}
    restarts_in_place = kind.in_place(body)
    pods = list(pods)

    restarts = 0
    past_budget = False
    if restarts_in_place:
        own = kind.object_restarts(body)
        restarts = own if own is not None else max(sum(kind.restarts(dict(p)) for p in pods), restarts_seen)
        budget = restart_budget(body)
        if budget is not None:
            # One failure more than the rule's budget ends the object (the scheduler's own limit,
            # e.g. the training operator's backoffLimit = budget + 1, says so too).
            past_budget = restarts > budget
            restarts = min(restarts, budget)

    terminal: list[Evidence] = [retained] if retained is not None else []
    restart_causes: list[Cause] = [last_restart] if last_restart is not None else []
    recheck: float | None = None
    running = False
    waiting = ""
    wait_limit = no_capacity_after(body)
    for pod in pods:
        found, at = kind_evidence(kind, body, pod, now=now, gone_nodes=gone_nodes)
        if found is not None and found.terminal:
            terminal.append(found)
        elif found is not None:
            restart_causes.append(found.cause)
        if not waiting:
            waiting, due = waiting_note(pod, now=now, no_capacity_after_seconds=wait_limit)
            if due is not None:
                at = due if at is None else min(at, due)
        if at is not None:
            recheck = at if recheck is None else min(recheck, at)
        if pod.get("status", {}).get("phase") == "Running" and not pod.get("metadata", {}).get(
            "deletionTimestamp"
        ):
            running = True
    evidence = best(terminal)
    # The adapter's last_restart is the latest restart it saw happen; without it, the latest here.
    restart_cause = last_restart or (restart_causes[-1] if restart_causes else None)

    # Deleted by someone else, kept by dispatch's finalizer until the record has it (always ended).
    held = bool(meta.get("deletionTimestamp")) and OBJECT_FINALIZER in (meta.get("finalizers") or ())

    def view(
        phase: Phase, cause: Cause | None = None, cancelled: bool = False, note: str = "", waiting: str = ""
    ) -> ObjectView:
        return ObjectView(
            id=oid,
            job=job,
            submission=submission,
            phase=phase,
            cause=cause,
            cancelled=cancelled,
            restarts=restarts,
            retained=held,
            note=note,
            waiting=waiting,
        )

    ended = annotations.get(ANNOTATION_ENDED)
    if ended:
        try:
            cause = Cause.model_validate(json.loads(ended))
        except ValueError:
            cause = Cause(kind=CauseKind.UNKNOWN, detail=detail("unreadable annotation", ANNOTATION_ENDED))
        # dispatch stops an object with no cause only when it was cancelled outside dispatch (its
        # Workload deactivated in Kueue): read back as that cancel.
        return Verdict(view(Phase.ENDED, cause, cancelled=cause.kind is CauseKind.NONE))
    outcome = kind.outcome(body, restart_cause)
    if outcome is not None:
        cause = evidence.cause if outcome.failed and evidence is not None else outcome.cause
        return Verdict(view(Phase.ENDED, cause))
    if meta.get("deletionTimestamp"):
        cause = evidence.cause if evidence is not None else Cause(kind=CauseKind.NONE, detail="deleted")
        return Verdict(view(Phase.ENDED, cause, cancelled=evidence is None))
    if evidence is not None:
        return Verdict(view(Phase.ENDED, evidence.cause), stop=evidence.cause)
    if past_budget:
        # Its scheduler ends it too, normally at once; but the training operator deletes the pods
        # before it writes Failed, and when that write fails its next pass no longer sees the
        # restarts and creates the pods anew: a run the rule does not allow. Stopped after the
        # grace unless the scheduler has ended it by then.
        cause = restart_cause or Cause(
            kind=CauseKind.NON_ZERO_EXIT, detail=f"restarted in place past the rule's budget of {budget}"
        )
        return Verdict(view(Phase.ENDED, cause), stop=cause, stop_after_grace=True)
    kueue = queued_verdict(kind, body, pods, workload, now=now, no_capacity_after=wait_limit)
    if kueue is not None:
        return Verdict(
            view(kueue.phase, kueue.cause, kueue.cancelled, waiting=kueue.waiting),
            stop=kueue.cause if kueue.stop else None,
            recheck_at=kueue.recheck_at,
        )
    if kind.suspended(body):
        if annotations.get(ANNOTATION_RELEASED):
            # Released by dispatch, suspended since by someone else (Kueue evicting it, a person):
            # theirs to resume. Shown as queued, so decide never releases it a second time.
            return Verdict(view(Phase.QUEUED, note=held_outside(kind, body)))
        return Verdict(view(Phase.HELD))
    if running or kind.running(body):
        return Verdict(view(Phase.RUNNING, waiting=waiting), recheck_at=recheck)
    return Verdict(view(Phase.QUEUED, waiting=waiting), recheck_at=recheck)


def held_outside(kind: Kind, body: Body) -> str:
    """Who suspended a released object: the field manager that owns its suspend field now (the
    latest writer of it, from managedFields), when that is not dispatch itself."""
    path = kind.suspend_patch(True)
    owners: list[tuple[str, str]] = []
    for entry in body.get("metadata", {}).get("managedFields") or ():
        fields: Any = entry.get("fieldsV1") or {}
        step: Any = path
        while isinstance(step, dict) and len(step) == 1 and isinstance(fields, dict):
            key = next(iter(step))
            fields, step = fields.get(f"f:{key}"), step[key]
        if fields is not None and not isinstance(step, dict) and entry.get("manager") != REPORTING_COMPONENT:
            owners.append((str(entry.get("time") or ""), str(entry.get("manager") or "")))
    who = max(owners)[1] if owners else ""
    by = f" by {who}" if who else ""
    return f"suspended{by} after dispatch released it; held outside dispatch until resumed there"


def vanished(last: ObjectView) -> ObjectView:
    """The view of an object deleted from the API server after it was seen as ``last``."""
    if last.phase is Phase.ENDED:
        return last.model_copy(update={"retained": False}) if last.retained else last
    return last.model_copy(
        update={
            "phase": Phase.ENDED,
            "cause": Cause(kind=CauseKind.NONE, detail="deleted"),
            "cancelled": True,
        }
    )


def true_condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    """The object's status condition ``kind`` when it is True, else None."""
    found = _conditions(obj).get(kind)
    return found if found is not None and found.get("status") == "True" else None

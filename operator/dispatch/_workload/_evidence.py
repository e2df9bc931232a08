"""What pods and Kubernetes' Events say about why an object ended (or restarted in place).

Pure functions, no I/O: the clock and what is known about nodes are passed in. Pods say more than
the object: controllers do not look at a pod's ``DisruptionTarget`` condition (or only to count it),
and their ``Failed`` condition says little more than that replicas failed. When several pods have
something to say, the cause first in dispatch's order wins (a preempted master explains the
workers' non-zero exits, an OOM explains a NCCL timeout elsewhere): :func:`best`.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from .._model import Cause, CauseKind, StopKind
from ._fields import detail, no_capacity_after, parse_time, status_conditions
from ._kind import Kind
from ._mask import Body

WAITING_AFTER: Final = 5.0
"""Seconds a pod stays unschedulable before status names it (:func:`waiting_note`): a preemptor
waiting for its victims to go, or a node on its way, passes without a status write."""
_RANK: Final = {kind: i for i, kind in enumerate(CauseKind)}
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
DISRUPTIONS: Final = frozenset({CauseKind.PREEMPTED, CauseKind.NODE_LOST})
"""Causes that stop a pod from outside: its program may still exit 0 on the SIGTERM they give."""

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


KILL_SIGNAL: Final = 9


@dataclass(frozen=True, slots=True)
class Evidence:
    cause: Cause
    terminal: bool
    """True when the object cannot go on; False for a restart in place (OnFailure)."""


def _container(pod: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    statuses = pod.get("status", {}).get("containerStatuses") or []
    for status in statuses:
        if status.get("name") == name:
            return dict(status)
    return dict(statuses[0]) if statuses else {}


def stopped_how(pod: Mapping[str, Any]) -> StopKind | None:
    """How a stop ended a pod, once its containers have terminated: killed by SIGKILL at its grace
    period's end (``forced``: exit code 137 or signal 9), or exited within it (``graceful``)."""
    statuses = pod.get("status", {}).get("containerStatuses") or []
    ended = [t for t in ((s.get("state") or {}).get("terminated") for s in statuses) if t]
    if not ended:
        return None
    if any(t.get("signal") == KILL_SIGNAL or t.get("exitCode") == KILL_SIGNAL + 128 for t in ended):
        return StopKind.FORCED
    return StopKind.GRACEFUL


def container_restarts(pod: Mapping[str, Any], container: str = "") -> int:
    """The training container's restartCount: the in-place restarts of this pod."""
    return int(_container(pod, container).get("restartCount") or 0)


_PLAIN_EXITS: Final = frozenset({"", "Error", "Completed"})
"""Termination reasons of a process that ended by itself or whose death is not told apart from an
exit (a process may ``exit(137)``): its exit code is all that is known."""


def termination_signal(term: Mapping[str, Any]) -> int | None:
    """The signal that killed a container, when its termination says so: the runtime's ``signal``,
    or an exit code 128+N with a reason that names a kill (``OOMKilled``: the kernel's SIGKILL)
    rather than a plain exit (``Error``, ``Completed``), where 128+N is the shell's convention."""
    given = term.get("signal")
    if isinstance(given, int) and given > 0:
        return given
    code = term.get("exitCode")
    if (term.get("reason") or "") in _PLAIN_EXITS or not isinstance(code, int):
        return None
    return code - 128 if 128 < code <= 128 + 64 else None


def _termination_cause(pod_name: str, term: Mapping[str, Any]) -> Cause | None:
    """The cause a container termination states, or None for a clean exit."""
    reason = term.get("reason") or ""
    code = term.get("exitCode")
    exit_code = code if isinstance(code, int) else None
    signal = termination_signal(term)
    message = term.get("message") or ""
    if reason == "OOMKilled":
        return Cause(
            kind=CauseKind.OUT_OF_MEMORY,
            detail=detail(f"pod {pod_name}", reason, message),
            exit_code=exit_code,
            signal=signal,
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
            signal=signal,
        )
    return None


_POD_REASONS: Final = {
    "Evicted": CauseKind.PREEMPTED,
    "DeadlineExceeded": CauseKind.TIME_LIMIT,
    **dict.fromkeys(POD_NODE_LOST_REASONS, CauseKind.NODE_LOST),
}
"""The pod's own ``status.reason`` values that end it for good, and the cause each one is."""


def pod_evidence(
    pod: Mapping[str, Any],
    *,
    restarts_in_place: bool,
    now: float,
    no_capacity_after_seconds: int,
    gone_nodes: Container[str] = (),
    container: str = "",
) -> tuple[Evidence | None, float | None]:
    """What one pod says about why its object ended (or restarted), and when to look again.

    The signals are read from the most precise down: a disruption or a lost node, the pod's own
    reason, its container's termination, a launch that cannot succeed, a failure nobody explains,
    and last a pod no node can take."""
    name = pod.get("metadata", {}).get("name", "?")
    status_of = _container(pod, container)
    code = ((status_of.get("state") or {}).get("terminated") or {}).get("exitCode")
    exit_code = code if isinstance(code, int) else None
    found = (
        _disrupted(pod, name, status_of, exit_code, gone_nodes)
        or _pod_reason(pod, name, exit_code)
        or _container_ended(pod, name, status_of, restarts_in_place=restarts_in_place)
        or _not_launched(pod, name, status_of, exit_code)
    )
    if found is not None:
        return found, None
    unplaced = unschedulable(pod, now=now)
    if unplaced is None:
        return None, None
    since, message = unplaced
    deadline = since + no_capacity_after_seconds
    if now >= deadline:
        text = detail(f"pod {name}", f"unschedulable for more than {no_capacity_after_seconds}s", message)
        return Evidence(Cause(kind=CauseKind.NO_CAPACITY, detail=text), terminal=True), None
    return None, deadline


def _disrupted(
    pod: Mapping[str, Any],
    name: str,
    status_of: Mapping[str, Any],
    exit_code: int | None,
    gone_nodes: Container[str],
) -> Evidence | None:
    """Kubernetes took the pod away: its ``DisruptionTarget`` condition, or its node is lost."""
    node = pod.get("spec", {}).get("nodeName") or ""
    disruption = status_conditions(pod).get("DisruptionTarget")
    if (
        disruption is not None
        and disruption.get("status") == "True"
        and not _done_before(pod, status_of, disruption)
    ):
        reason = disruption.get("reason") or ""
        message = disruption.get("message") or ""
        if reason in NODE_LOSS_REASONS:
            kind = CauseKind.NODE_LOST
        elif reason == KUBELET_TERMINATION:
            lost = (node and node in gone_nodes) or "shutdown" in message.lower()
            kind = CauseKind.NODE_LOST if lost else CauseKind.PREEMPTED
        else:  # PREEMPTION_REASONS, and any disruption Kubernetes adds later
            kind = CauseKind.PREEMPTED
        text = detail(f"pod {name}", reason, message, f"node {node}" if node else "")
        return Evidence(Cause(kind=kind, detail=text, exit_code=exit_code), terminal=True)
    if node and node in gone_nodes and needs_node(pod):
        text = detail(f"pod {name}", "deleted while its node is lost (NotReady or gone)", f"node {node}")
        return Evidence(Cause(kind=CauseKind.NODE_LOST, detail=text, exit_code=exit_code), True)
    return None


def _done_before(pod: Mapping[str, Any], status_of: Mapping[str, Any], disruption: Mapping[str, Any]) -> bool:
    """A pod that succeeded before the disruption came (a finished pod deleted afterwards). One
    that succeeded after it was stopped by it: a kubelet gives a deleted pod SIGTERM, and a
    program that exits 0 on it (the training contract: write a checkpoint and exit) makes the pod
    ``Succeeded``, which its controller counts as done although the work was not."""
    if pod.get("status", {}).get("phase") != "Succeeded":
        return False
    finished = parse_time(((status_of.get("state") or {}).get("terminated") or {}).get("finishedAt"))
    since = parse_time(disruption.get("lastTransitionTime"))
    return finished is not None and since is not None and finished < since


OWN_LIMIT_MARKS: Final = ("exceeds the limit", "exceeds the total limit", "exceeded its local ephemeral")
"""The kubelet's words for an eviction of a pod over its own limit (an emptyDir's ``sizeLimit``,
its containers' ephemeral storage), under the same reason, ``Evicted``, as a node-pressure
eviction."""


def evicted_cause(message: str) -> CauseKind:
    """An ``Evicted`` pod's cause: ``preempted`` when the node needed the room, ``unknown`` when the
    pod outgrew its own limit. That one the job does to itself and would do again in the next
    submission, so a rule on ``preempted`` must not resubmit it."""
    return CauseKind.UNKNOWN if any(m in message for m in OWN_LIMIT_MARKS) else CauseKind.PREEMPTED


def _pod_reason(pod: Mapping[str, Any], name: str, exit_code: int | None) -> Evidence | None:
    """The pod's own reason ends it (:data:`_POD_REASONS`)."""
    status = pod.get("status", {})
    pod_reason = status.get("reason") or ""
    kind = _POD_REASONS.get(pod_reason)
    if kind is None:
        return None
    if pod_reason == "Evicted":
        kind = evicted_cause(status.get("message") or "")
    text = detail(f"pod {name}", pod_reason, status.get("message") or "")
    return Evidence(Cause(kind=kind, detail=text, exit_code=exit_code), True)


def _container_ended(
    pod: Mapping[str, Any], name: str, status_of: Mapping[str, Any], *, restarts_in_place: bool
) -> Evidence | None:
    """What the container's termination says, now (``state``) or before a restart (``lastState``)."""
    phase = pod.get("status", {}).get("phase")
    # A pod being deleted is stopped by its deletion (SIGTERM, then SIGKILL: 143 or 137 "Error"):
    # that exit says who deleted it, not why the object ended. A controller deletes every pod at
    # its backoff limit or on suspend, or the running ones once the job failed; a disruption, a
    # lost node or a specific reason (OOMKilled) still count.
    deleting = bool(pod.get("metadata", {}).get("deletionTimestamp"))
    term = (status_of.get("state") or {}).get("terminated")
    if term is not None and phase != "Succeeded":
        cause = _termination_cause(name, term)
        if cause is not None and not (deleting and cause.kind is CauseKind.NON_ZERO_EXIT):
            # Under OnFailure the kubelet restarts the container; the pod fails only for pod-level reasons.
            return Evidence(cause, terminal=not restarts_in_place or phase == "Failed")
    last = (status_of.get("lastState") or {}).get("terminated")
    if last is not None:
        cause = _termination_cause(name, last)
        if cause is not None:
            # Restarted in place by the kubelet: a restart under the native rule, or else (pods
            # built with restartPolicy OnFailure by a runtime dispatch does not control) an end no
            # rule of the plan asked to restart: the kit stops the object on it.
            return Evidence(cause, terminal=not restarts_in_place)
    return None


def _not_launched(
    pod: Mapping[str, Any], name: str, status_of: Mapping[str, Any], exit_code: int | None
) -> Evidence | None:
    """A launch that cannot succeed (an image, a config, a node's admission), or a failure nobody
    explains."""
    status = pod.get("status", {})
    pod_reason = status.get("reason") or ""
    pod_message = status.get("message") or ""
    waiting = (status_of.get("state") or {}).get("waiting") or {}
    if waiting.get("reason") in LAUNCH_ERRORS:
        text = detail(f"pod {name}", waiting.get("reason"), waiting.get("message"))
        return Evidence(Cause(kind=CauseKind.LAUNCH_FAILED, detail=text), terminal=True)
    if pod_reason.startswith("OutOf") or pod_reason in ("UnexpectedAdmissionError", "NodeAffinity"):
        text = detail(f"pod {name}", pod_reason, pod_message)
        return Evidence(Cause(kind=CauseKind.LAUNCH_FAILED, detail=text), True)
    if status.get("phase") == "Failed" and not pod.get("metadata", {}).get("deletionTimestamp"):
        text = detail(f"pod {name}", "failed", pod_reason, pod_message)
        return Evidence(Cause(kind=CauseKind.UNKNOWN, detail=text, exit_code=exit_code), terminal=True)
    return None


def unschedulable(pod: Mapping[str, Any], *, now: float) -> tuple[float, str] | None:
    """Since when kube-scheduler has found no node for a pending pod, and what it said, or None."""
    if pod.get("status", {}).get("phase") != "Pending":
        return None  # before the conditions: classify asks this of every running pod at every turn
    scheduled = status_conditions(pod).get("PodScheduled")
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
    disruption = status_conditions(pod).get("DisruptionTarget")
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
                cause = evicted_cause(message)
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

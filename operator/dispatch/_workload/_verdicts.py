"""The verdict on one cached object: :func:`~._classify.classify` over what the cache knows, kept
while nothing it was computed from changes, and completed from the API server when the cache cannot
say why an object ended (its pods, the disruption Events, whether its nodes are still there).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final

from .._constants import ANNOTATION_ENDED, LABEL_JOB, LABEL_SUBMISSION
from .._errors import BackendError
from .._kubeclient import Client, KubeError, request, resource_version
from .._model import CauseKind, ObjectView, Phase
from ._cache import Cache
from ._classify import Verdict, classify, pods_started
from ._evidence import Evidence, best, event_evidence, kind_evidence, needs_node, node_ready
from ._fields import owner_of, parse_time
from ._kind import Kind
from ._kueue import Workloads, WorkloadView
from ._mask import Body
from ._requests import split_id
from ._tracked import Tracked, kept_view
from ._wakes import Wakes

NODE_CACHE_SECONDS: Final = 10.0
LOOK_AGAIN_SECONDS: Final = 3.0
EARLY_EVENT_CAUSES: Final = frozenset({CauseKind.PREEMPTED})
"""What an Event may say of a watched object that runs before its pods say it: a disruption that
only ever hits a live pod (the scheduler's Preempted, the kubelet's Evicted). Not the taint
manager's eviction: it deletes a node's terminated pods too, so its Event can follow an
out-of-memory or an exit the pod watch has not delivered yet (the pods' word comes first then). A
controller's Event that it cannot create pods ends only an object with no pod at all
(``PODLESS_AFTER_SECONDS``)."""
PODLESS_AFTER_SECONDS: Final = 2.0


class Verdicts:
    """Classifies the cache's objects; keeps what it learnt of nodes and from the API server."""

    def __init__(
        self,
        kind: Kind,
        api: Client,
        cache: Cache,
        wakes: Wakes,
        clock: Callable[[], float],
        log: logging.Logger,
    ) -> None:
        self.kind = kind
        self.api = api
        self.cache = cache
        self.wakes = wakes
        self.clock = clock
        self.log = log
        self.born = clock()
        """When this process started watching: an object released before then was not watched."""
        self.nodes: dict[str, tuple[bool, float]] = {}
        self.workloads: Workloads | None = None
        """Kueue's Workloads, once watched (:meth:`WorkloadBackend.prepare`)."""

    def workload_of(self, body: Body) -> WorkloadView | None:
        return self.workloads.of(body) if self.workloads is not None else None

    def lost_nodes(self) -> set[str]:
        """The nodes this process found gone or not Ready, and has not looked up again since."""
        now = time.monotonic()
        return {node for node, (is_lost, until) in self.nodes.items() if is_lost and until > now}

    def terminating(self, view: ObjectView) -> ObjectView:
        """Ended, but a pod of it still runs (a deletion's grace period, a stop the controller has not
        carried out yet): the job must not settle yet. A pod being deleted on a lost node is not
        waited for: no kubelet will ever confirm it."""
        if view.phase is not Phase.ENDED:
            return view
        tracked = self.cache.tracked.get(view.id)
        if tracked is None:
            return view
        lost = self.lost_nodes()
        for pod in tracked.pod_bodies():
            if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                continue
            deleting = pod.get("metadata", {}).get("deletionTimestamp")
            if deleting and pod.get("spec", {}).get("nodeName") in lost:
                continue
            return view.model_copy(update={"terminating": True})
        return view

    def now(self, oid: str, body: Body) -> Verdict:
        """Without I/O: nodes are taken as present unless this process already found them gone."""
        state = self.cache.tracked.get(oid) or Tracked()
        return classify(
            self.kind,
            body,
            state.pod_bodies(),
            now=self.clock(),
            gone_nodes=self.lost_nodes(),
            retained=state.retained,
            last_restart=state.last_restart,
            restarts_seen=sum(state.incarnations.values()),
            workload=self.workload_of(body),
            started=state.started_at,
        )

    async def classify(self, oid: str, body: Body) -> Verdict:
        """The verdict on one object; remembered while nothing it was computed from has changed
        (a job's list() classifies every object it ever had, many times per recovery).

        When the cache holds no reason for an object's end (the pods are gone, the pod watch lags
        the object watch, or this process started after the fact), the API server is asked once:
        the pods themselves, then the disruption events Kubernetes recorded on them (see
        :meth:`look_for_evidence`; the events come from the Events watches' index once they have
        listed, and an Event arriving later wakes the job and is read here without a request). A
        released object restarting pods in place is looked at once per process the same way, since
        its controller may recreate a preempted pod by itself. Any other object released before this
        process watched it is read from the Events index: its controller may replace a deleted pod
        too (when it did not see the pod fail before it was gone), so a preemption while no process
        watched can leave a running pod and only the disruption Event (the Events watches' first
        list wakes the job)."""
        state = self.cache.state(oid)
        verdict = await self.cached(oid, body)
        view = verdict.view
        unexplained = (
            view.phase is Phase.ENDED
            and view.cause is not None
            and (view.cause.kind is CauseKind.UNKNOWN and not view.cancelled)
        )
        released = view.phase in (Phase.QUEUED, Phase.RUNNING) and not self.kind.suspended(body)
        started = parse_time(body.get("status", {}).get("startTime"))
        # Released before this process watched it: a pod may have been preempted and recreated
        # by the controller meanwhile (its watch saw everything since).
        unwatched = released and (started is None or started < self.born)
        recreating = unwatched and self.kind.in_place(body)
        podless = released and view.phase is Phase.QUEUED and not state.pods
        if podless:
            podless = self._podless_due(oid, body, state, started, view.job)
        annotated = (body.get("metadata", {}).get("annotations") or {}).get(ANNOTATION_ENDED)
        now = time.monotonic()
        if (unexplained or recreating or podless) and not annotated and state.looked <= now:
            # Once per process for an end or an in-place object; every few seconds while a
            # released object has no pod at all (its controller may be failing to create them).
            again = podless and not recreating
            state.looked = now + LOOK_AGAIN_SECONDS if again else float("inf")
            if again and view.job and self.cache.events.indexed(oid) is None:
                # (With the Events watches listed, the controller's Event wakes the job itself.)
                self.wakes.wake_at(f"look:{oid}", view.job, self.clock() + LOOK_AGAIN_SECONDS)
            if await self.look_for_evidence(oid, body, pods_too=unexplained):
                verdict = await self.cached(oid, body)
            return verdict
        # Objects for which whatever an Event says counts (podless as settled above):
        any_event = unexplained or podless or unwatched
        running_once = released and not self.kind.in_place(body)
        indexed = oid in self.cache.events.evidence
        if (
            (any_event or running_once)
            and not annotated
            and indexed
            and self._read_indexed(oid, body, any_event)
        ):
            verdict = await self.cached(oid, body)
        return verdict

    def _podless_due(self, oid: str, body: Body, state: Tracked, started: float | None, job: str) -> bool:
        """A released object with no pod counts as podless only once its controller has had
        ``PODLESS_AFTER_SECONDS`` to create them; until then, its job is woken when that is due."""
        since = started or state.released_at or parse_time(body.get("metadata", {}).get("creationTimestamp"))
        due = (since if since is not None else self.clock()) + PODLESS_AFTER_SECONDS
        if self.clock() < due:
            if job:
                self.wakes.wake_at(f"look:{oid}", job, due)
            return False
        return True

    def _read_indexed(self, oid: str, body: Body, any_event: bool) -> bool:
        """An Event arrived since the last look (the watch woke the job): read from the index,
        whatever the other Events watches have listed yet (each Event indexed wakes the job). For
        a released object whose pods run once (no restart in place) too: the scheduler's Preempted
        Event comes on a watch of a few Events, while the pod watch carries every pod's every status
        and lags it by seconds in a mass preemption; the pod's own word would end it the same way,
        later. True if it changed what is kept."""
        events = list(self.cache.events.evidence[oid].values())
        found = event_evidence(self.kind, body, events)
        if found is not None and not any_event and found.cause.kind not in EARLY_EVENT_CAUSES:
            return False  # its pods speak first: only a disruption of a live pod is read early
        return found is not None and self.keep_evidence(oid, [found])

    async def cached(self, oid: str, body: Body) -> Verdict:
        """:func:`classify` on what the cache holds, kept while none of its inputs changes."""
        state = self.cache.state(oid)
        workload = self.workload_of(body)
        seen = sum(state.incarnations.values())
        key = (
            resource_version(body),
            tuple(sorted((k, p.version) for k, p in state.pods.items())),
            state.retained,
            state.last_restart,
            seen,
            workload.resource_version if workload is not None else None,
        )
        if state.verdict is not None and state.verdict[0] == key:
            return state.verdict[1]
        pods = state.pod_bodies()
        lost: set[str] = set()
        uses_nodes = False
        for pod in pods:
            if needs_node(pod):
                uses_nodes = True
                node = pod.get("spec", {}).get("nodeName")
                if node and await self.node_lost(node):
                    lost.add(node)
                elif node and state.job:
                    # Not lost yet: no event will say when it is (nodes are not watched), so look
                    # again once the lookup has expired from the node cache.
                    self.wakes.wake_at(f"node:{oid}", state.job, self.clock() + NODE_CACHE_SECONDS)
        verdict = classify(
            self.kind,
            body,
            pods,
            now=self.clock(),
            gone_nodes=lost,
            retained=state.retained,
            last_restart=state.last_restart,
            restarts_seen=seen,
            workload=workload,
            started=state.started_at,
        )
        if state.started_at is None:
            state.started_at = pods_started(pods)  # kept for when the pods are gone
        if verdict.recheck_at is None and not uses_nodes and None not in key[:1]:
            kept_view(verdict.view)
            state.verdict = (key, verdict)  # neither the clock nor a node lookup can change it
        else:
            state.verdict = None
        return verdict

    async def look_for_evidence(self, oid: str, body: Body, *, pods_too: bool) -> bool:
        """Ask the API server why ``oid``'s pods ended, when the cache cannot say; True if found.

        First (``pods_too``) the pods by label, read now (the pod watch may lag the object watch
        that brought the end). Then the events Kubernetes wrote on them, which outlive the pods
        (an hour by default), from the Events watches' index (read with a LIST only until those
        watches have listed once): the scheduler's ``Preempted``, the taint manager's
        ``TaintManagerEviction``, the kubelet's ``Evicted``, and the controller's
        ``create_failure_reason`` on the object (its pods can never be created). Only events from
        after the object was created count, so a reused name cannot inherit an old cause."""
        namespace, _ = split_id(oid, "object")
        state = self.cache.state(oid)
        found: list[Evidence] = []
        try:
            if pods_too:
                found += await self._pods_evidence(namespace, body)
            if not found:
                events = self.cache.events.indexed(oid)
                if events is None:  # the Events watches have not listed yet: read them
                    events = await self.cache.events.disruption_events(namespace)
                evidence = event_evidence(self.kind, body, events)
                if evidence is not None:
                    found.append(evidence)
        except BackendError as error:
            self.log.debug("look for the evidence of %s: %s", oid, error)
            state.looked = 0.0  # try again on the next list()
            return False
        return self.keep_evidence(oid, found)

    async def _pods_evidence(self, namespace: str, body: Body) -> list[Evidence]:
        """What the object's pods, read now by label, say of its end."""
        owner = owner_of(body)
        if owner is None:
            return []
        selector = f"{LABEL_JOB}={owner[0].split('/', 1)[1]},{LABEL_SUBMISSION}={owner[1]}"
        listing = await request(
            self.api, "GET", f"/api/v1/namespaces/{namespace}/pods", query={"labelSelector": selector}
        )
        found: list[Evidence] = []
        for pod in listing.get("items") or []:
            evidence, _ = kind_evidence(self.kind, body, pod, now=self.clock())
            if evidence is not None and evidence.terminal:
                found.append(evidence)
        return found

    def keep_evidence(self, oid: str, found: list[Evidence]) -> bool:
        """Keep the best of ``found`` and what was kept before; True if that changed."""
        state = self.cache.state(oid)
        kept = best([*found, *([state.retained] if state.retained is not None else [])])
        if kept is None or kept == state.retained:
            return False
        self.log.info("%s: %s found on the API server (%s)", oid, kept.cause.kind, kept.cause.detail)
        state.retained = kept
        return True

    async def node_lost(self, node: str) -> bool:
        """The node is gone (404) or not Ready: what ran on it cannot be reached."""
        now = time.monotonic()
        known = self.nodes.get(node)
        if known is not None and known[1] > now:
            return known[0]
        try:
            found = await request(self.api, "GET", f"/api/v1/nodes/{node}")
            lost = not node_ready(found)
        except KubeError as error:
            if error.status != 404:
                self.log.debug("cannot tell whether node %s exists: %s", node, error)
            lost = error.status == 404
        self.nodes[node] = (lost, now + NODE_CACHE_SECONDS)
        return lost

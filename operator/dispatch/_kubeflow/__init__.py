"""The Kubeflow adapter: each submission of a DispatchJob is one PyTorchJob (``kubeflow.org/v1``).

See docs/kubeflow.md. Object ids are ``"<namespace>/<pytorchjob name>"``; job ids are
``"<namespace>/<name>"`` of a DispatchJob.

One list+watch per resource (PyTorchJobs and pods labelled ``app.kubernetes.io/managed-by=dispatch``)
feeds an in-memory cache shared by every job; each event wakes the subscribers of the job it belongs
to, so the path from a pod or PyTorchJob change to the supervisor's next decision never polls.
:meth:`KubeflowBackend.list` answers from that cache once it has synced, completed by what this
process wrote itself (an object it created is shown even before the watch brings it back).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from kubernetes_asyncio.client import ApiClient

from .._constants import (
    ANNOTATION_ENDED,
    GROUP,
    KUBEFLOW_GROUP,
    KUBEFLOW_VERSION,
    LABEL_JOB,
    LABEL_MANAGED_BY,
    LABEL_SUBMISSION,
    MANAGED_BY,
    PLURAL,
    PYTORCHJOB_PLURAL,
    VERSION,
)
from .._errors import BackendError, ObjectExists, TransientBackendError
from .._model import Action, Capabilities, Cause, CauseKind, JobSpec, NativeRule, ObjectView, Phase, Plan
from .._protocols import Unsubscribe, Wake
from ._build import build, object_name
from ._classify import (
    KUBELET_TERMINATION,
    Evidence,
    best,
    classify,
    ended_annotation,
    in_place,
    no_capacity_after,
    owner_of,
    pod_evidence,
    vanished,
)
from ._http import MERGE_PATCH, Body, KubeError, request
from ._informer import Informer, key_of, resource_version

log = logging.getLogger("dispatch.kubeflow")

CAPABILITIES: Final = Capabilities(
    native=(
        NativeRule(
            causes=frozenset({CauseKind.NON_ZERO_EXIT, CauseKind.OUT_OF_MEMORY}),
            action=Action.RESTART,
            note="restartPolicy OnFailure restarts failed pods in place, up to backoffLimit",
        ),
    )
)
SELECTOR: Final = f"{LABEL_MANAGED_BY}={MANAGED_BY}"
MAX_TOMBSTONES: Final = 10_000
NODE_CACHE_SECONDS: Final = 10.0


def split_id(value: str, what: str = "job") -> tuple[str, str]:
    namespace, sep, name = value.partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise BackendError(f"a Kubeflow {what} id is '<namespace>/<name>', not {value!r}")
    return namespace, name


class KubeflowBackend:
    """A :class:`~dispatch.Backend` running each submission as a PyTorchJob."""

    def __init__(
        self,
        api: ApiClient,
        *,
        namespaces: Sequence[str] | None = None,
        stop_ended: bool = True,
        sync_timeout: float = 30.0,
        owns_api: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``namespaces`` limits the watches (default: all namespaces). ``stop_ended=False`` makes a
        read-only observer: it never stops an object whose pods say it has ended."""
        self.api = api
        self.namespaces = tuple(namespaces) if namespaces else None
        self.stop_ended = stop_ended
        self.sync_timeout = sync_timeout
        self._owns_api = owns_api
        self._clock = clock
        self._subscribers: dict[str, list[Wake]] = {}
        self._informers: list[Informer] = []
        self._pj_informers: list[Informer] = []
        self._pod_informers: list[Informer] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._pjs: dict[str, Body] = {}  # object id -> PyTorchJob (from the watch)
        self._by_job: dict[str, set[str]] = {}  # job id -> object ids
        self._pods: dict[str, dict[str, Body]] = {}  # object id -> pod key -> pod
        self._overlay: dict[str, Body] = {}  # object id -> the body of our own last write
        self._overlay_job: dict[str, str] = {}
        self._ended_by_us: dict[str, str] = {}  # object id -> job id
        self._tombstones: OrderedDict[str, ObjectView] = OrderedDict()
        self._last_views: dict[str, ObjectView] = {}
        self._retained: dict[str, Evidence] = {}
        self._last_restart: dict[str, Cause] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._nodes: dict[str, tuple[bool, float]] = {}
        self._restarts: dict[str, int] = {}  # object id -> most restarts seen (pods are recreated)

    # ---- Backend protocol ------------------------------------------------------------------

    @property
    def name(self) -> str:
        return "kubeflow"

    @property
    def capabilities(self) -> Capabilities:
        return CAPABILITIES

    async def create(self, job: str, submission: int, spec: JobSpec, plan: Plan) -> str:
        namespace, job_name = split_id(job)
        self._start()
        owner = await self._call(
            "GET",
            f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{job_name}",
            what=f"DispatchJob {job}",
        )
        uid = owner.get("metadata", {}).get("uid")
        if not uid:
            raise BackendError(f"DispatchJob {job} has no uid")
        body = build(
            namespace=namespace, job_name=job_name, submission=submission, spec=spec, plan=plan, owner_uid=uid
        )
        oid = f"{namespace}/{object_name(job_name, submission)}"
        try:
            created = await request(self.api, "POST", self._pj_path(namespace), body=body)
        except KubeError as error:
            if error.status == 409:
                raise ObjectExists(oid) from None
            raise self._explain(error, f"create PyTorchJob {oid}") from None
        self._remember(oid, job, created)
        return oid

    async def release(self, object_id: str) -> None:
        namespace, name = split_id(object_id, "object")
        body = self._current(object_id)
        for _ in range(5):
            if body is None:
                body = await self._get_pj(namespace, name)
                if body is None:
                    log.info("release %s: it no longer exists", object_id)
                    return
            annotations = body.get("metadata", {}).get("annotations") or {}
            run_policy = body.get("spec", {}).get("runPolicy") or {}
            if (
                annotations.get(ANNOTATION_ENDED)
                or not run_policy.get("suspend")
                or body["metadata"].get("deletionTimestamp")
            ):
                return  # already released, or ended: never unsuspend what dispatch has stopped
            patch = {
                "metadata": {"resourceVersion": body["metadata"]["resourceVersion"]},
                "spec": {"runPolicy": {"suspend": False}},
            }
            try:
                patched = await request(
                    self.api, "PATCH", self._pj_path(namespace, name), body=patch, content_type=MERGE_PATCH
                )
            except KubeError as error:
                if error.status == 404:
                    return
                if error.status == 409:
                    body = None  # changed since read: read again and decide again
                    continue
                raise self._explain(error, f"release PyTorchJob {object_id}") from None
            self._remember(object_id, None, patched)
            return
        raise TransientBackendError(f"release {object_id}: it kept changing under us")

    async def end(self, object_id: str) -> None:
        namespace, name = split_id(object_id, "object")
        body = self._current(object_id)
        owner = owner_of(body) if body is not None else None
        try:
            await request(
                self.api, "DELETE", self._pj_path(namespace, name), query={"propagationPolicy": "Background"}
            )
        except KubeError as error:
            if error.status != 404:
                raise self._explain(error, f"delete PyTorchJob {object_id}") from None
        if owner is not None:
            self._ended_by_us[object_id] = owner[0]
        await self._delete_pods(namespace, name, body)
        self._wake(owner[0] if owner is not None else None)

    async def list(self, job: str) -> Sequence[ObjectView]:
        split_id(job)
        await self._synced()
        ids = set(self._by_job.get(job, ()))
        ids.update(oid for oid, j in self._overlay_job.items() if j == job)
        ids.update(oid for oid, j in self._ended_by_us.items() if j == job)
        views: list[ObjectView] = []
        for oid in sorted(ids):
            if oid in self._tombstones:
                continue
            body = self._current(oid)
            if body is None:
                continue
            verdict = await self._classify(oid, body)
            view = verdict.view
            seen = self._restarts.get(oid, 0)
            if view.restarts < seen:
                view = view.model_copy(update={"restarts": seen})
            else:
                self._restarts[oid] = view.restarts
            if oid in self._ended_by_us:
                view = vanished(view)
            elif verdict.stop is not None and self.stop_ended:
                await self._stop(oid, body, verdict.stop)
            self._last_views[oid] = view
            if verdict.recheck_at is not None:
                self._wake_at(f"recheck:{oid}", job, verdict.recheck_at)
            views.append(view)
        views.extend(v for v in self._tombstones.values() if v.job == job)
        views.sort(key=lambda v: (v.submission, v.id))
        return views

    def subscribe(self, job: str, wake: Wake) -> Unsubscribe:
        self._subscribers.setdefault(job, []).append(wake)
        with contextlib.suppress(RuntimeError):  # no running loop: started by the first call
            self._start()

        def unsubscribe() -> None:
            wakes = self._subscribers.get(job)
            if wakes is not None:
                with contextlib.suppress(ValueError):
                    wakes.remove(wake)
                if not wakes:
                    del self._subscribers[job]

        return unsubscribe

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        await asyncio.sleep(0)  # let the aborted watch connections finish closing
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        self._subscribers.clear()
        if self._owns_api:
            await self.api.close()

    # ---- the cache ---------------------------------------------------------------------------

    def _start(self) -> None:
        if self._tasks:
            return
        loop = asyncio.get_running_loop()
        scopes: Sequence[str | None] = self.namespaces or (None,)
        for ns in scopes:
            pj = Informer(
                self.api,
                self._pj_path(ns),
                label_selector=SELECTOR,
                on_change=self._pj_changed,
                on_relist=self._pj_relisted,
                what=f"PyTorchJobs{' in ' + ns if ns else ''}",
            )
            pods = Informer(
                self.api,
                f"/api/v1/namespaces/{ns}/pods" if ns else "/api/v1/pods",
                label_selector=SELECTOR,
                on_change=self._pod_changed,
                what=f"pods{' in ' + ns if ns else ''}",
            )
            self._pj_informers.append(pj)
            self._pod_informers.append(pods)
        self._informers = [*self._pj_informers, *self._pod_informers]
        self._tasks = [loop.create_task(i.run(), name=f"dispatch-kubeflow-{i.what}") for i in self._informers]

    async def _synced(self) -> None:
        self._start()
        pending = [i for i in self._informers if not i.synced.is_set()]
        if not pending:
            return
        try:
            async with asyncio.timeout(self.sync_timeout):
                await asyncio.gather(*(i.synced.wait() for i in pending))
        except TimeoutError:
            reasons = "; ".join(f"{i.what}: {i.last_error}" for i in pending if i.last_error) or "no answer"
            hint = ""
            if any(isinstance(i.last_error, KubeError) and i.last_error.status == 404 for i in pending):
                hint = f" (is the PyTorchJob CRD {PYTORCHJOB_PLURAL}.{KUBEFLOW_GROUP} installed?)"
            raise TransientBackendError(f"the Kubeflow watches have not synced: {reasons}{hint}") from None

    def _pj_changed(self, old: Body | None, new: Body | None) -> None:
        body = new if new is not None else old
        if body is None:
            return
        oid = key_of(body)
        owner = owner_of(body)
        job = owner[0] if owner is not None else None
        if new is None:
            self._pjs.pop(oid, None)
            if job is not None:
                self._by_job.get(job, set()).discard(oid)
                last = self._last_views.get(oid)
                if last is None:
                    last = self._classify_now(oid, body)
                self._tombstone(vanished(last))
            self._forget(oid)
        else:
            self._pjs[oid] = new
            if job is not None:
                self._by_job.setdefault(job, set()).add(oid)
            mine = self._overlay.get(oid)
            if mine is not None and (resource_version(new) or 0) >= (resource_version(mine) or 0):
                self._overlay.pop(oid, None)
                self._overlay_job.pop(oid, None)
        self._wake(job)

    def _pj_relisted(self, rv: str) -> None:
        """Our own writes older than a fresh list and missing from it were deleted meanwhile."""
        try:
            listed = int(rv)
        except ValueError:
            return
        for oid, body in list(self._overlay.items()):
            if oid not in self._pjs and (resource_version(body) or 0) <= listed:
                self._pj_changed(body, None)

    def _pod_changed(self, old: Body | None, new: Body | None) -> None:
        body = new if new is not None else old
        if body is None:
            return
        owner = owner_of(body)
        if owner is None:
            return
        job, n = owner
        namespace, job_name = job.split("/", 1)
        oid = f"{namespace}/{object_name(job_name, n)}"
        pod_key = key_of(body)
        pj = self._current(oid)
        if new is None:
            self._pods.get(oid, {}).pop(pod_key, None)
            timer = self._timers.pop(f"pod:{pod_key}", None)
            if timer is not None:
                timer.cancel()
            if pj is not None:
                self._retain(oid, pj, body)
        else:
            self._pods.setdefault(oid, {})[pod_key] = new
            if pj is not None:
                self._retain(oid, pj, new, only_restarts=True)
                _, at = pod_evidence(
                    new,
                    restarts_in_place=in_place(pj),
                    now=self._clock(),
                    no_capacity_after_seconds=no_capacity_after(pj),
                )
                if at is not None:
                    self._wake_at(f"pod:{pod_key}", job, at)
        self._wake(job)

    def _retain(self, oid: str, pj: Body, pod: Body, *, only_restarts: bool = False) -> None:
        """Keep what a pod said about the end of its object, for when the pod is gone."""
        found, _ = pod_evidence(
            pod,
            restarts_in_place=in_place(pj),
            now=self._clock(),
            no_capacity_after_seconds=no_capacity_after(pj),
        )
        if found is None or found.cause.kind is CauseKind.NO_CAPACITY:
            return
        if not found.terminal:
            self._last_restart[oid] = found.cause
        elif not only_restarts:
            kept = best(e for e in (self._retained.get(oid), found) if e is not None)
            if kept is not None:
                self._retained[oid] = kept

    def _forget(self, oid: str) -> None:
        self._overlay.pop(oid, None)
        self._overlay_job.pop(oid, None)
        self._ended_by_us.pop(oid, None)
        self._retained.pop(oid, None)
        self._last_restart.pop(oid, None)
        self._last_views.pop(oid, None)
        self._restarts.pop(oid, None)
        timer = self._timers.pop(f"recheck:{oid}", None)
        if timer is not None:
            timer.cancel()

    def _tombstone(self, view: ObjectView) -> None:
        self._tombstones[view.id] = view
        self._tombstones.move_to_end(view.id)
        while len(self._tombstones) > MAX_TOMBSTONES:
            self._tombstones.popitem(last=False)

    def _remember(self, oid: str, job: str | None, body: Body) -> None:
        """Our own write: newer than the cache until the watch brings it (or something newer) back."""
        cached = self._pjs.get(oid)
        if cached is not None and (resource_version(cached) or 0) >= (resource_version(body) or 0):
            return
        self._overlay[oid] = body
        owner = owner_of(body)
        self._overlay_job[oid] = job if job is not None else (owner[0] if owner is not None else "")
        self._tombstones.pop(oid, None)

    def _current(self, oid: str) -> Body | None:
        cached = self._pjs.get(oid)
        mine = self._overlay.get(oid)
        if mine is None:
            return cached
        if cached is None or (resource_version(mine) or 0) > (resource_version(cached) or 0):
            return mine
        return cached

    def _wake(self, job: str | None) -> None:
        if job is None:
            return
        for wake in list(self._subscribers.get(job, ())):
            wake()

    def _wake_at(self, key: str, job: str, at: float) -> None:
        """Wake ``job`` at wall-clock time ``at`` (a threshold no event will announce)."""
        if key in self._timers:
            return
        loop = asyncio.get_running_loop()
        delay = max(at - self._clock(), 0.0) + 0.05

        def fire() -> None:
            self._timers.pop(key, None)
            self._wake(job)

        self._timers[key] = loop.call_later(delay, fire)

    # ---- classification ----------------------------------------------------------------------

    def _classify_now(self, oid: str, body: Body) -> ObjectView:
        pods = list(self._pods.get(oid, {}).values())
        return classify(
            body,
            pods,
            now=self._clock(),
            retained=self._retained.get(oid),
            last_restart=self._last_restart.get(oid),
        ).view

    async def _classify(self, oid: str, body: Body) -> Any:
        pods = list(self._pods.get(oid, {}).values())
        gone: set[str] = set()
        for pod in pods:
            for condition in pod.get("status", {}).get("conditions") or []:
                if (
                    condition.get("type") == "DisruptionTarget"
                    and condition.get("reason") == KUBELET_TERMINATION
                ):
                    node = pod.get("spec", {}).get("nodeName")
                    if node and await self._node_gone(node):
                        gone.add(node)
        return classify(
            body,
            pods,
            now=self._clock(),
            gone_nodes=gone,
            retained=self._retained.get(oid),
            last_restart=self._last_restart.get(oid),
        )

    async def _node_gone(self, node: str) -> bool:
        now = time.monotonic()
        known = self._nodes.get(node)
        if known is not None and known[1] > now:
            return known[0]
        try:
            await request(self.api, "GET", f"/api/v1/nodes/{node}")
            gone = False
        except KubeError as error:
            if error.status != 404:
                log.debug("cannot tell whether node %s exists: %s", node, error)
            gone = error.status == 404
        self._nodes[node] = (gone, now + NODE_CACHE_SECONDS)
        return gone

    # ---- writes ------------------------------------------------------------------------------

    async def _stop(self, oid: str, body: Body, cause: Cause) -> None:
        """End an object the scheduler would carry on, keeping why on the object itself.

        One conditional merge patch records the cause in an annotation and suspends the PyTorchJob
        (so the training operator deletes its pods and creates no more); then the pods are deleted.
        """
        namespace, name = split_id(oid, "object")
        current: Body | None = body
        for _ in range(5):
            if current is None:
                current = await self._get_pj(namespace, name)
                if current is None:
                    return
            meta = current.get("metadata", {})
            if (meta.get("annotations") or {}).get(ANNOTATION_ENDED) or meta.get("deletionTimestamp"):
                self._remember(oid, None, current)
                break
            patch = {
                "metadata": {
                    "resourceVersion": meta.get("resourceVersion"),
                    "annotations": {ANNOTATION_ENDED: ended_annotation(cause)},
                },
                "spec": {"runPolicy": {"suspend": True}},
            }
            try:
                patched = await request(
                    self.api, "PATCH", self._pj_path(namespace, name), body=patch, content_type=MERGE_PATCH
                )
            except KubeError as error:
                if error.status == 404:
                    return
                if error.status == 409:
                    current = None
                    continue
                raise self._explain(error, f"stop PyTorchJob {oid}") from None
            log.info("stopped %s: %s (%s)", oid, cause.kind, cause.detail)
            self._remember(oid, None, patched)
            break
        else:
            raise TransientBackendError(f"stop {oid}: it kept changing under us")
        await self._delete_pods(namespace, name, body)

    async def _delete_pods(self, namespace: str, name: str, body: Body | None) -> None:
        owner = owner_of(body) if body is not None else None
        if owner is not None:
            job_name, n = owner[0].split("/", 1)[1], owner[1]
        else:
            job_name, _, tail = name.rpartition("-")
            if not job_name or not tail.isdigit():
                return
            n = int(tail)
        selector = f"{LABEL_JOB}={job_name},{LABEL_SUBMISSION}={n}"
        try:
            await request(
                self.api, "DELETE", f"/api/v1/namespaces/{namespace}/pods", query={"labelSelector": selector}
            )
        except KubeError as error:
            if error.status != 404:
                raise self._explain(error, f"delete the pods of PyTorchJob {namespace}/{name}") from None

    async def _get_pj(self, namespace: str, name: str) -> Body | None:
        try:
            return await request(self.api, "GET", self._pj_path(namespace, name))
        except KubeError as error:
            if error.status == 404:
                return None
            raise self._explain(error, f"read PyTorchJob {namespace}/{name}") from None

    async def _call(self, method: str, path: str, *, what: str) -> Body:
        try:
            return await request(self.api, method, path)
        except KubeError as error:
            raise self._explain(error, f"{method} {what}") from None

    @staticmethod
    def _explain(error: KubeError, doing: str) -> BackendError:
        if error.status == 404:
            return BackendError(f"{doing}: not found ({error.message})")
        if error.status in (401, 403):
            return BackendError(f"{doing}: not allowed ({error.status} {error.reason}): {error.message}")
        if error.status == 422:
            return BackendError(f"{doing}: rejected as invalid: {error.message}")
        return BackendError(f"{doing}: {error.status} {error.reason}: {error.message}")

    @staticmethod
    def _pj_path(namespace: str | None, name: str | None = None) -> str:
        base = f"/apis/{KUBEFLOW_GROUP}/{KUBEFLOW_VERSION}"
        path = (
            f"{base}/namespaces/{namespace}/{PYTORCHJOB_PLURAL}"
            if namespace
            else f"{base}/{PYTORCHJOB_PLURAL}"
        )
        return f"{path}/{name}" if name else path

    # ---- for tests and benchmarks -------------------------------------------------------------

    def watch_events(self) -> int:
        """How many watch events the shared watches have delivered (not counting lists)."""
        return sum(i.events for i in self._informers)


async def open_adapter(config: Mapping[str, object] | None = None) -> KubeflowBackend:
    """Entry point ``dispatch.adapters: kubeflow``.

    Config: ``kubeconfig`` (path; default $KUBECONFIG, ~/.kube/config, else in-cluster),
    ``context``, ``namespaces`` (list; default all), ``stop_ended`` (default true).
    """
    from .._kubeapi import new_client

    config = dict(config or {})
    unknown = set(config) - {"kubeconfig", "context", "namespaces", "stop_ended"}
    if unknown:
        raise ValueError(f"kubeflow adapter: unknown config keys {sorted(unknown)}")
    kubeconfig = config.get("kubeconfig")
    context = config.get("context")
    namespaces = config.get("namespaces")
    if namespaces is not None and not (
        isinstance(namespaces, list | tuple) and all(isinstance(n, str) for n in namespaces)
    ):
        raise ValueError("kubeflow adapter: namespaces must be a list of namespace names")
    api = await new_client(
        str(kubeconfig) if kubeconfig is not None else None,
        context=str(context) if context is not None else None,
    )
    return KubeflowBackend(
        api,
        namespaces=list(namespaces) if namespaces is not None else None,
        stop_ended=bool(config.get("stop_ended", True)),
        owns_api=True,
    )


__all__ = ["CAPABILITIES", "KubeflowBackend", "Phase", "open_adapter"]

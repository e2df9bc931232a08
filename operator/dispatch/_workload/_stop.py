"""Stopping what the scheduler would carry on: the stop lane, off the reaction path.

An object whose pods say it has ended is reported ended as soon as the evidence is seen; the stop
(the suspend patch with ``dispatch.dev/ended``) runs in a background task per object, started with
urgent writes. The release's fence (:mod:`._fence`) and :meth:`Stopper.quiesce` (before a job is
recorded settled) are where a stop must have landed. See docs/kubeflow.md, "Stopping what the
scheduler would carry on".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass
from typing import Final

from .._constants import ANNOTATION_ENDED
from .._errors import BackendError, TransientBackendError
from .._kubeclient import MERGE_PATCH, KubeError, request, urgent
from .._model import Cause, CauseKind, ObjectView, Phase
from ._cache import Cache
from ._classify import Verdict, classify
from ._fields import ended_annotation, owner_of
from ._kind import Kind
from ._kueue import stop_patch
from ._mask import Body
from ._requests import ObjectApi, explain, split_id
from ._tracked import Stop
from ._verdicts import Verdicts
from ._wakes import Wakes

STOP_RETRY: Final = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


@dataclass(eq=False)
class Stopper:
    """Decides, starts, writes and awaits the stops of the cache's objects."""

    kind: Kind
    objects: ObjectApi
    cache: Cache
    verdicts: Verdicts
    wakes: Wakes
    _: KW_ONLY
    enabled: bool
    """False: a read-only observer, which never stops an object whose pods say it has ended."""
    grace: float
    """How long a stop the controller will make itself waits for it before dispatch writes it."""
    pod_cleanup_after: float
    """How long after a stop the pods may still run before dispatch deletes them itself."""
    started: Callable[[], bool]
    """The watches run (a stop is started from a watch event only then)."""
    log: logging.Logger

    def stopped(self, body: Body) -> bool:
        """The API server says this object can run nothing any more, for good: stopped by dispatch
        (the annotation), finished by its controller (which then runs nothing), or being deleted.
        None of these can be undone by dispatch or the controller."""
        meta = body.get("metadata", {})
        if (meta.get("annotations") or {}).get(ANNOTATION_ENDED) or meta.get("deletionTimestamp"):
            return True
        return self.kind.outcome(body, None) is not None

    def unrecorded(self, body: Body, cause: Cause) -> bool:
        """The API server does not keep ``cause`` on this finished object: no annotation, not being
        deleted, and the object alone (its status, without the pods) says something else."""
        meta = body.get("metadata", {})
        if (meta.get("annotations") or {}).get(ANNOTATION_ENDED) or meta.get("deletionTimestamp"):
            return False
        alone = classify(self.kind, body, (), now=self.verdicts.clock()).view.cause
        return alone is None or alone.kind is not cause.kind

    def view(self, oid: str, body: Body, verdict: Verdict, view: ObjectView) -> ObjectView:
        """The view of an object this process stops (or must stop): ended with the stop's cause."""
        stop = self.cache.state(oid).stop
        if stop is None:
            if not self.enabled:
                return view
            if verdict.stop is None:
                self._record_if_unrecorded(oid, body, view)
                return view
            stop = self.register(oid, body, verdict.stop, after_grace=verdict.stop_after_grace)
            if stop is None:
                return view
        if view.phase is not Phase.ENDED or verdict.stop is not None:
            # Evidence seen once is final (a pod recreated before the stop lands does not revive
            # the object), and the view keeps the cause the annotation will say.
            # A stop with no cause is an object cancelled outside dispatch (a Workload deactivated
            # in Kueue): it stays a cancel, as the annotation will say.
            cancelled = stop.cause.kind is CauseKind.NONE
            view = view.model_copy(update={"phase": Phase.ENDED, "cause": stop.cause, "cancelled": cancelled})
        self.ensure_task(stop)
        return view

    def _record_if_unrecorded(self, oid: str, body: Body, view: ObjectView) -> None:
        """Finished by its controller for a reason only the pods gave: write it down before they
        go, so a restarted adapter reads the same cause."""
        cause = view.cause
        if (
            view.phase is Phase.ENDED
            and cause is not None
            and not view.cancelled
            and self.stopped(body)
            and self.unrecorded(body, cause)
        ):
            stop = self.register(oid, body, cause, deferrable=False)
            if stop is not None:
                self.ensure_task(stop)

    def register(
        self, oid: str, body: Body, cause: Cause, *, deferrable: bool | None = None, after_grace: bool = False
    ) -> Stop | None:
        """``after_grace`` (``Verdict.stop_after_grace``): deferred, and settling waits for it."""
        state = self.cache.state(oid)
        if state.stop is not None:
            return state.stop
        owner = owner_of(body)
        if owner is None:
            return None
        if after_grace:
            deferrable = True
        elif deferrable is None:
            failed_pod = any(
                p.get("status", {}).get("phase") == "Failed"
                and not p.get("metadata", {}).get("deletionTimestamp")
                for p in state.pod_bodies()
            )
            deferrable = failed_pod and not self.kind.in_place(body)
        stop = Stop(oid, owner[0], owner[1], cause, deferrable=deferrable, settle_waits=after_grace)
        state.stop = stop
        self.cache.index(oid, owner[0])
        return stop

    def ensure_task(self, stop: Stop) -> None:
        """Start the stop's task with urgent writes (the write limit's first lane; a task keeps the
        context it was created in) wherever it is started, a watch event or a list(): it is the
        first write of a recovery, whose release waits for it (the fence), and nothing settles
        before it. Routine, a mass preemption's stops waited behind every other job's recovery
        writes, and so did each release."""
        if stop.landed or (stop.task is not None and not stop.task.done()):
            return
        with urgent(True):
            stop.task = self.wakes.spawn(self._run(stop), f"dispatch-{self.kind.name}-stop-{stop.oid}")

    async def _run(self, stop: Stop) -> None:
        """Write the stop (unless the API server already says it is stopped); never raises."""
        try:
            if stop.deferrable and self.grace > 0 and not stop.now.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.grace):
                        await stop.now.wait()
            failures = 0
            while True:
                body = self.cache.current(stop.oid)
                if body is None:
                    break  # gone: nothing to write
                finished = self.stopped(body)
                if finished and not self.unrecorded(body, stop.cause):
                    break  # finished by its controller, and it says what the pods said
                try:
                    # On a finished object only the cause is written: the pods that said it are
                    # deleted soon (a preempted pod about a second later), the object stays.
                    await self.patch(stop.oid, stop.cause, suspend=not finished)
                    break
                except TransientBackendError as error:
                    delay = STOP_RETRY[min(failures, len(STOP_RETRY) - 1)]
                    failures += 1
                    self.log.warning("stop %s: %s; again in %.2fs", stop.oid, error, delay)
                    await asyncio.sleep(delay)
            stop.landed = True
        except asyncio.CancelledError:
            raise
        except Exception as error:
            self.log.warning("stop %s: %s", stop.oid, error)
            stop.error = error

    async def patch(self, oid: str, cause: Cause, *, suspend: bool = True) -> None:
        """One merge patch: the cause into ``dispatch.dev/ended`` and the kind's suspend (its
        controller then deletes the pods and creates no more). No resourceVersion: it only ever moves
        the object towards stopped, so it cannot undo anyone's write that matters, and a status
        update by the controller does not make it fail with 409. A release racing with it is
        conditional (resourceVersion) and refuses once the annotation is there."""
        namespace, name = split_id(oid, "object")
        body = self.cache.current(oid)
        queued = stop_patch(body) if body is not None and suspend else {}
        patch: Body = {**(self.kind.suspend_patch(True) if suspend else {})}
        patch["metadata"] = {
            **queued.get("metadata", {}),
            "annotations": {ANNOTATION_ENDED: ended_annotation(cause)},
        }
        try:
            patched = await request(
                self.objects.api,
                "PATCH",
                self.objects.path(namespace, name),
                body=patch,
                content_type=MERGE_PATCH,
            )
        except KubeError as error:
            if error.status == 404:
                return
            raise explain(error, f"stop {self.objects.noun} {oid}") from None
        self.log.info("%s %s: %s (%s)", "stopped" if suspend else "recorded", oid, cause.kind, cause.detail)
        self.cache.remember(oid, None, patched)
        if queued:
            await self._delete_queued(oid, namespace, name)
        if suspend:
            self._schedule_cleanup(oid)

    async def _delete_queued(self, oid: str, namespace: str, name: str) -> None:
        """Deleting a stopped queued object deletes its Workload, so Kueue can neither requeue nor
        restart it; the finalizer keeps the object (and the cause) until the record has it. Retried
        here: once the annotation is there the stop counts as landed, and nothing else would delete
        it."""
        for delay in (*STOP_RETRY, None):
            try:
                await self.objects.delete(namespace, name)
                break
            except TransientBackendError as error:
                if delay is None:
                    raise
                self.log.warning("delete stopped %s: %s; again in %.2fs", oid, error, delay)
                await asyncio.sleep(delay)

    def _schedule_cleanup(self, oid: str) -> None:
        """The controller deletes a suspended object's pods; if some still run after
        ``pod_cleanup_after`` (no controller, or a stuck one), delete them ourselves."""

        def fire() -> None:
            self.wakes.spawn(self.cleanup_pods(oid), f"dispatch-{self.kind.name}-cleanup-{oid}")

        self.wakes.later(f"cleanup:{oid}", self.pod_cleanup_after, fire)

    async def cleanup_pods(self, oid: str) -> None:
        """Each pod the watch still shows running is deleted by name: a pod already gone answers
        404 at no cost, where a DELETE by label selector makes the API server scan every pod of the
        namespace (in a mass preemption with a lagging pod watch, hundreds of those time out)."""
        tracked = self.cache.tracked.get(oid)
        alive = [
            p
            for p in (tracked.pod_bodies() if tracked is not None else ())
            if not p.get("metadata", {}).get("deletionTimestamp")
            and p.get("status", {}).get("phase") in ("Running", "Pending")
        ]
        if not alive:
            return
        self.log.info("%d pod(s) of stopped %s still run: deleting them", len(alive), oid)
        for pod in alive:
            meta = pod.get("metadata", {})
            try:
                await self.objects.delete_pod(meta.get("namespace", ""), meta.get("name", ""))
            except BackendError as error:  # a 5xx or a dropped connection too: logged, not retried
                self.log.warning("delete pod %s of stopped %s: %s", meta.get("name"), oid, error)

    def check(self, oid: str) -> None:
        """From the watches: start a stop as soon as the evidence arrives, for the jobs someone in
        this process supervises (never for others: a standby operator writes nothing)."""
        if not self.enabled or not self.started():
            return
        body = self.cache.current(oid)
        if body is None:
            return
        state = self.cache.state(oid)
        stop = state.stop
        if stop is not None:
            if self.stopped(body):
                stop.now.set()  # a deferred stop has nothing left to write
            return
        owner = owner_of(body)
        if owner is None or not self.wakes.supervised(owner[0]):
            return
        if self.stopped(body) or state.ended_by_us or state.sweeping:
            return
        if self.verdicts.now(oid, body).stop is None:
            return
        state.sweeping = True
        self.wakes.spawn(self._sweep(oid), f"dispatch-{self.kind.name}-sweep-{oid}")

    async def _sweep(self, oid: str) -> None:
        try:
            body = self.cache.current(oid)
            if body is None or self.cache.state(oid).stop is not None:
                return
            verdict = await self.verdicts.classify(oid, body)
            if verdict.stop is not None and self.cache.state(oid).stop is None:
                stop = self.register(oid, body, verdict.stop, after_grace=verdict.stop_after_grace)
                if stop is not None:
                    self.ensure_task(stop)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            self.log.debug("sweep %s: %s", oid, error)
        finally:
            tracked = self.cache.tracked.get(oid)
            if tracked is not None:
                tracked.sweeping = False

    def stops_of(self, job: str) -> list[Stop]:
        found = []
        for oid in self.cache.ids_of(job):
            tracked = self.cache.tracked.get(oid)
            if tracked is not None and tracked.stop is not None:
                found.append(tracked.stop)
        return found

    async def quiesce(self, job: str) -> None:
        """Every stop of ``job``'s objects that their controller will not make itself (not
        deferrable) has landed, so that no object of a settled job can still run. Deferrable stops
        are the controller's own doing (but for ``settle_waits``); the fence covers them all."""
        for stop in self.stops_of(job):
            if (stop.settle_waits or not stop.deferrable) and not stop.landed:
                await self.wait(stop)

    async def wait(self, stop: Stop, *, now: bool = False) -> None:
        """Wait until ``stop`` has landed, starting (or restarting) it if needed."""
        if now:
            stop.now.set()
        stop.error = None
        self.ensure_task(stop)
        if stop.task is not None and not stop.landed:
            await asyncio.shield(stop.task)
        if not stop.landed:
            error = stop.error
            if isinstance(error, BackendError):
                raise error
            raise TransientBackendError(f"stop {stop.oid}: {error or 'not done yet'}")

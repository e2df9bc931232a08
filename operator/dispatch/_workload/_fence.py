"""The fence: before an object of a job is released, no older object of that job can run any more.

This keeps "at most one released object per job" without the supervisor waiting for a stop before
it authorizes and creates the next submission: the stop lands in the background (:mod:`._stop`),
and the release waits here only for what has not landed yet (usually nothing).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from .._constants import LABEL_JOB
from .._kubeclient import key_of
from .._model import Cause, CauseKind
from ._cache import Cache
from ._fields import owner_of
from ._kind import object_name
from ._mask import Body
from ._requests import SELECTOR, ObjectApi, split_id
from ._stop import Stopper
from ._verdicts import Verdicts


@dataclass(eq=False)
class Fence:
    """Stops, and waits for, every older object of a job before one of its objects is released."""

    objects: ObjectApi
    cache: Cache
    verdicts: Verdicts
    stopper: Stopper
    log: logging.Logger

    async def hold(self, job: str, submission: int, releasing: str) -> None:
        """Make sure no object of ``job`` older than ``submission`` can run any more.

        An object counts as stopped only by what the API server says for good (annotation,
        finished, being deleted: :meth:`Stopper.stopped`), so a stale cache can only cause a
        redundant write, never a second released object. Objects this process has never seen
        (deleted before it started, or not yet in its watch) are looked up with one read.
        """
        namespace, job_name = split_id(job)
        seen: set[int] = set()
        for oid in sorted(self.cache.ids_of(job)):
            body = self.cache.current(oid)
            owner = owner_of(body) if body is not None else None
            if body is None or owner is None or oid == releasing:
                continue
            seen.add(owner[1])
            if owner[1] < submission and not self.stopper.stopped(body):
                await self.stop_now(oid, body, submission)
        missing = [
            k
            for k in range(1, submission)
            if k not in seen and f"{namespace}/{object_name(job_name, k)}" not in self.cache.tombstones
        ]
        if not missing:
            return
        listing = await self.objects.list_query(
            self.objects.path(namespace), {"labelSelector": f"{LABEL_JOB}={job_name},{SELECTOR}"}
        )
        for item in listing.get("items") or []:
            owner = owner_of(item)
            oid = key_of(item)
            if owner is None or owner[0] != job or owner[1] >= submission or oid == releasing:
                continue
            if not self.stopper.stopped(item):
                self.cache.remember(oid, job, item)
                await self.stop_now(oid, item, submission)

    async def stop_now(self, oid: str, body: Body, submission: int) -> None:
        stop = self.cache.state(oid).stop
        if stop is None:
            verdict = await self.verdicts.classify(oid, body)
            cause = verdict.stop or Cause(
                kind=CauseKind.UNKNOWN,
                detail=f"stopped by dispatch before submission {submission} of the job was released",
            )
            stop = self.stopper.register(oid, body, cause)
            if stop is None:
                return
        if stop.landed and not self.stopper.stopped(self.cache.current(oid) or body):
            stop.landed = False  # it was gone from our cache, but the API server still has it
        self.log.info("release of submission %d waits for the stop of %s", submission, oid)
        await self.stopper.wait(stop, now=True)

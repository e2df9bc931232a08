"""One shared poller per backend: one ``GET /jobs`` per cycle for every job this process supervises.

The cost of a cycle does not depend on how many jobs are supervised: slurmrestd has no server-side
filter, so the poller lists every job once (``update_time`` makes an unchanged list a 304 on 22.05
and an empty 200 on 24.11+) and filters dispatch's tagged jobs on this side. It keeps the last view
of every tagged job, remembers the final state of every job it saw end (Slurm forgets finished jobs
after MinJobAge when there is no slurmdbd), and wakes the subscribers of the jobs whose objects
changed.

What a listing may prove (docs/slurm.md, "What a listing proves"):

* ``decide`` needs the objects listed after the record was read, or a canonical another process
  just created could be missing and read as gone. A cache shared by many supervisors keeps that
  rule with two bounds of the same length ``max_age`` (1.5 poll intervals): :meth:`Poller.list`
  answers from a listing that started at most ``max_age`` before the call, and never returns an
  object until ``max_age`` has passed since it was created (its ``submit_time``, or this process's
  own create). A record naming an object is written only after some process listed it, so at least
  ``max_age`` after its creation; whoever reads that record calls ``list`` later still, and gets a
  listing that started after the creation: the object is in it. So the cost stays one listing per
  cycle for every supervised job, and a new object waits at most 1.5 intervals before it is used.
* A job seen before and missing from a listing is not taken as gone: a direct lookup (``GET
  /jobs/state`` on v0.0.40+, ``GET /job/{id}`` on v0.0.38) must confirm it first. A job the lookup
  still finds keeps its view (the listing was empty or truncated).
* A listing whose ``last_update`` is older than one already applied is refused as a whole.
* A confirmed absence says whether Slurm forgot a job that ended (its ids have moved past it) or has
  no memory of it at all (no job id that high: slurmctld lost its state).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from ..._errors import TransientBackendError
from ..._model import Cause, CauseKind, ObjectView, Phase
from ..._protocols import Others
from ._classify import classify
from ._dialects import SlurmJob

log = logging.getLogger("dispatch.slurm")

TAG = re.compile(r"^dispatch:job=(?P<job>[^;]+);submission=(?P<n>\d+)$")


@dataclass(frozen=True, slots=True)
class Listing:
    """One answer to a listing: every job Slurm shows, or ``jobs`` None when nothing changed."""

    jobs: list[SlurmJob] | None
    last_update: int | None = None
    """slurmctld's time of its last job change, where the API says it (v0.0.40+)."""


Fetch = Callable[[int | None], Awaitable[Listing]]
"""fetch(update_time) -> the listing (update_time None: a full one)."""
Lookup = Callable[[list[int]], Awaitable[tuple[dict[int, SlurmJob | None], int]]]
"""lookup(ids) -> (the ids Slurm still knows, each with its record when the lookup gives one; the
highest job id the lookup showed, 0 when it shows only the ids asked about)."""
Wake = Callable[[], None]

FORGOTTEN = (
    "Slurm no longer shows job {id} (confirmed by a direct lookup) and this process never saw it end: "
    "it ended more than MinJobAge ago and slurmctld forgot it (outcome unknown without slurmdbd)"
)
NEVER_HAD = (
    "Slurm has no job {id} (confirmed by a direct lookup) and shows no job id that high: slurmctld "
    "lost its state (restarted without it?), so it no longer knows this job ever existed"
)
NO_JOBS = (
    "Slurm has no job {id} (confirmed by a direct lookup) and shows no job at all: either it ended "
    "more than MinJobAge ago and was forgotten, or slurmctld lost its state; the outcome is unknown"
)


def _at(epoch: int | None) -> datetime | None:
    """Slurm's epoch seconds as a time."""
    return datetime.fromtimestamp(epoch, UTC) if epoch is not None else None


def make_tag(job: str, submission: int) -> str:
    return f"dispatch:job={job};submission={submission}"


def parse_tag(comment: str) -> tuple[str, int] | None:
    m = TAG.match(comment or "")
    return (m.group("job"), int(m.group("n"))) if m else None


@dataclass(slots=True)
class _Override:
    view: ObjectView
    at: float  # monotonic time of the local change; any listing that started later supersedes it


class Poller:
    def __init__(
        self,
        fetch: Fetch,
        *,
        interval: float = 2.0,
        max_backoff: float = 60.0,
        full_every: int = 30,
        remember_seconds: float = 86400.0,
        update_time_margin: int = 1,
        user_name: str | None = None,
        owner_of: Callable[[str], str | None] | None = None,
        cancel_stuck: Callable[[int], Awaitable[None]] | None = None,
        lookup: Lookup | None = None,
    ) -> None:
        self._fetch = fetch
        self.interval = interval
        self.max_backoff = max_backoff
        self.full_every = max(1, full_every)
        self.remember_seconds = remember_seconds
        self.update_time_margin = update_time_margin
        self.user_name = user_name
        self._owner_of = owner_of
        """The Slurm user a job's objects must belong to, by job (None: ``user_name``)."""
        self._foreign: set[int] = set()
        """Tagged jobs of another user already reported."""
        self._cancel_stuck = cancel_stuck
        self._lookup = lookup

        self._views: dict[int, ObjectView] = {}
        self._by_job: dict[str, set[int]] = {}
        self._final: dict[int, tuple[ObjectView, float]] = {}
        self._verdicts: dict[int, ObjectView] = {}
        self._overrides: dict[int, _Override] = {}
        self._dirty: dict[str, float] = {}
        self._subs: dict[str, list[Wake]] = {}
        self._others = Others()  # subscribe_others: jobs without a subscriber

        self._last_update: int | None = None  # the newest last_update applied
        self._usable_at: dict[int, float] = {}  # monotonic time from which list() may return a job
        self._last_start: float | None = None  # monotonic start of the last successful cycle
        self._last_full_wall: float | None = None  # wall-clock start of the last full listing
        self._cycles_since_full = 0
        self._inflight: asyncio.Task[None] | None = None
        self._inflight_start = 0.0
        self._loop_task: asyncio.Task[None] | None = None
        self._kick = asyncio.Event()
        self._failures = 0
        self._backoff_until = 0.0
        self._last_error: TransientBackendError | None = None
        self._cancelling: set[int] = set()
        self._bg: set[asyncio.Task[None]] = set()
        self._closed = False

        self.cycles = 0
        """Listings done (each one request)."""
        self.not_modified = 0
        """Listings answered "nothing changed" (304, or 24.11+'s empty list)."""
        self.lookups = 0
        """Direct lookups made to confirm an absence."""
        self.contradicted = 0
        """Jobs a listing left out that the direct lookup still found (empty or truncated listings)."""

    # ------------------------------------------------------------------ what the backend reads

    def views(self, job: str) -> list[ObjectView]:
        return sorted(
            (self._views[i] for i in self._by_job.get(job, ()) if i in self._views), key=lambda v: int(v.id)
        )

    def view(self, job_id: int) -> ObjectView | None:
        return self._views.get(job_id)

    @property
    def max_age(self) -> float:
        """How old a listing list() may answer from, and how long a new object waits to be returned.

        1.5 intervals: the loop lists every interval, so a caller never finds the cache just past
        its age (which would cost a second listing per cycle), and the bound still holds.
        """
        return self.interval * 1.5

    async def list(self, job: str) -> list[ObjectView]:
        """The objects of ``job`` from a listing that started at most :attr:`max_age` before this call.

        Also never older than this process's own changes to the job, and never with an object
        created less than :attr:`max_age` ago (the module's docstring says why both bounds make a
        shared cache keep ``decide``'s ordering rule).
        """
        called = time.monotonic()
        dirty = self._dirty.get(job)
        stale = self._last_start is None or called - self._last_start > self.max_age
        if dirty is not None or stale:
            if called < self._backoff_until and self._last_error is not None:
                raise TransientBackendError(str(self._last_error))
            await self.refresh(after=called if stale or dirty is None else dirty)
        while True:
            views = self.views(job)
            now = time.monotonic()
            wait = max((self._usable_at.get(int(v.id), 0.0) - now for v in views), default=0.0)
            if wait <= 0:
                return views
            await asyncio.sleep(wait)

    # ------------------------------------------------------------------ local knowledge

    def note_created(self, job_id: int, job: str, submission: int) -> None:
        """The backend created ``job_id`` held: show it before the next listing does."""
        view = ObjectView(id=str(job_id), job=job, submission=submission, phase=Phase.HELD)
        now = time.monotonic()
        self._usable_at[job_id] = now + self.max_age
        self._overrides[job_id] = _Override(view, now)
        self._set(job_id, view)

    def note_verdict(self, job_id: int, view: ObjectView) -> None:
        """dispatch decided how ``job_id`` ended (a refused release): every later view says so."""
        self._verdicts[job_id] = view
        self._final[job_id] = (view, time.monotonic())
        self._overrides[job_id] = _Override(view, time.monotonic())
        self._set(job_id, view)
        self.mark_dirty(job_id)

    def note_released(self, job_id: int) -> None:
        cur = self._views.get(job_id)
        if cur is not None and cur.phase is Phase.HELD:
            view = cur.model_copy(update={"phase": Phase.QUEUED})
            self._overrides[job_id] = _Override(view, time.monotonic())
            self._set(job_id, view)
        self.mark_dirty(job_id)

    def mark_dirty(self, job_id: int) -> None:
        cur = self._views.get(job_id)
        if cur is not None:
            self._dirty[cur.job] = time.monotonic()
        self._kick.set()

    def _set(self, job_id: int, view: ObjectView) -> None:
        old = self._views.get(job_id)
        self._views[job_id] = view
        self._by_job.setdefault(view.job, set()).add(job_id)
        if old != view:
            self._wake(view.job)

    # ------------------------------------------------------------------ subscriptions and the loop

    def subscribe(self, job: str, wake: Wake) -> Callable[[], None]:
        self._subs.setdefault(job, []).append(wake)
        self._ensure_loop()

        def unsubscribe() -> None:
            wakes = self._subs.get(job)
            if wakes and wake in wakes:
                wakes.remove(wake)
                if not wakes:
                    del self._subs[job]

        return unsubscribe

    def subscribe_others(self, wake: Callable[[str], None]) -> Callable[[], None]:
        """Call ``wake(job)`` when a listing changes what a job with no subscriber shows (a settled
        job's late object). Only while the poller polls, that is while some job is subscribed: a
        poll for nobody but settled jobs would cost slurmrestd a request per cycle forever."""
        return self._others.subscribe(wake)

    def _ensure_loop(self) -> None:
        if self._closed or (self._loop_task is not None and not self._loop_task.done()):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop yet: list() still refreshes on demand
        self._loop_task = loop.create_task(self._run(), name="dispatch-slurm-poller")

    async def _run(self) -> None:
        kicked = False
        while self._subs and not self._closed:
            last = self._last_start
            since = None if last is None else time.monotonic() - last
            delay = self.interval
            if kicked or since is None or since >= self.interval or self._failures:
                try:
                    await self.refresh(after=time.monotonic())
                except TransientBackendError as e:
                    delay = self._backoff_delay()
                    log.warning("slurm poll failed (%s); next try in %.1fs", e, delay)
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # a bug must not kill supervision; back off and go on
                    delay = self._backoff_delay()
                    log.exception("slurm poll crashed (%s); next try in %.1fs", type(e).__name__, delay)
            else:
                delay = self.interval - since  # a caller's listing counts as this cycle's
            self._kick.clear()
            kicked = False
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._kick.wait()
                    kicked = True
                # kicked: a local change wants a listing soon, but never more often than every 50 ms
                await asyncio.sleep(0.05)

    def _backoff_delay(self) -> float:
        return min(self.interval * (1 << min(self._failures, 16)), self.max_backoff)

    async def aclose(self) -> None:
        self._closed = True
        tasks = [t for t in (self._loop_task, self._inflight, *self._bg) if t is not None and not t.done()]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(BaseException):
                await t

    # ------------------------------------------------------------------ one cycle

    async def refresh(self, after: float | None = None) -> None:
        """Make sure a listing that started at or after ``after`` (monotonic) has completed."""
        after = time.monotonic() if after is None else after
        while True:
            task = self._inflight
            if task is not None and not task.done():
                started = self._inflight_start
                await asyncio.shield(task)
                if started >= after:
                    return
                continue
            if self._last_start is not None and self._last_start >= after:
                return
            self._inflight_start = time.monotonic()
            self._inflight = asyncio.get_running_loop().create_task(self._cycle(self._inflight_start))
            self._inflight.add_done_callback(_retrieve)

    async def _cycle(self, start: float) -> None:
        start_wall = time.time()
        full = self._last_full_wall is None or self._cycles_since_full + 1 >= self.full_every
        update_time = (
            None
            if full or self._last_full_wall is None
            else int(self._last_full_wall) - self.update_time_margin
        )
        try:
            listing = await self._fetch(update_time)
            if listing.jobs is not None:
                if (
                    listing.last_update is not None
                    and self._last_update is not None
                    and listing.last_update < self._last_update
                ):
                    raise TransientBackendError(
                        f"slurmrestd answered a job list older than one already read (last_update "
                        f"{listing.last_update} < {self._last_update}): not trusted"
                    )
                await self._apply(listing.jobs, start)
        except TransientBackendError as e:
            self._failures += 1
            self._last_error = e
            self._backoff_until = time.monotonic() + self._backoff_delay()
            raise
        self.cycles += 1
        self._failures = 0
        self._last_error = None
        self._backoff_until = 0.0
        if listing.jobs is None:
            self.not_modified += 1
            self._cycles_since_full += 1
        else:
            if listing.last_update is not None:
                self._last_update = listing.last_update
            self._cycles_since_full = 0
            self._last_full_wall = start_wall
        self._last_start = start
        for job, at in list(self._dirty.items()):
            if at <= start:
                del self._dirty[job]

    def _view_of(self, sj: SlurmJob, job: str, n: int) -> tuple[ObjectView, bool]:
        c = classify(sj)
        verdict = self._verdicts.get(sj.job_id)
        if verdict is not None:
            return verdict, c.stuck
        view = ObjectView(
            id=str(sj.job_id),
            job=job,
            submission=n,
            phase=c.phase,
            cause=c.cause,
            cancelled=c.cancelled,
            restarts=c.restarts,
            waiting=c.waiting,
            stop=c.stop,
            started_at=_at(sj.started()),
        )
        if c.stuck:
            self._verdicts[sj.job_id] = view
        return view, c.stuck

    async def _apply(self, jobs: Iterable[SlurmJob], start: float) -> None:
        seen: dict[int, ObjectView] = {}
        highest = 0
        wall, mono = time.time(), time.monotonic()
        for sj in jobs:
            highest = max(highest, sj.job_id)
            tag = parse_tag(sj.comment)
            if tag is None:
                continue
            owner = self._owner_of(tag[0]) if self._owner_of is not None else None
            owner = self.user_name if owner is None else owner
            if owner is not None and (owner == "" or (sj.user_name and sj.user_name != owner)):
                if sj.job_id not in self._foreign:
                    self._foreign.add(sj.job_id)
                    log.warning(
                        "Slurm job %s carries the tag of %s submission %s but belongs to user %r, not "
                        "%r: not ours, left alone",
                        sj.job_id,
                        tag[0],
                        tag[1],
                        sj.user_name,
                        owner or "no Slurm identity",
                    )
                continue
            if sj.job_id not in self._usable_at:
                # Created before this listing started; by its submit_time (+1 s: whole seconds, and
                # a little clock skew) when Slurm gives one, else from the listing's start.
                created = (
                    start if sj.submit_time is None else min(start, mono - (wall - sj.submit_time) + 1.0)
                )
                self._usable_at[sj.job_id] = created + self.max_age
            view, stuck = self._view_of(sj, *tag)
            if stuck:
                self._cancel_later(sj.job_id)
            seen[sj.job_id] = view

        # Seen before, not ended, and absent now: only a direct lookup may say it is gone.
        missing = [
            i
            for i, v in self._views.items()
            if i not in seen
            and i not in self._final
            and not (i in self._overrides and self._overrides[i].at >= start)
        ]
        gone: set[int] = set(missing)
        if missing and self._lookup is not None:
            self.lookups += 1
            known, shown = await self._lookup(missing)
            highest = max(highest, shown)
            for i, rec in known.items():
                if i not in gone:
                    continue
                gone.discard(i)
                self.contradicted += 1
                old = self._views[i]
                seen[i] = self._view_of(rec, old.job, old.submission)[0] if rec is not None else old
            if known:
                log.warning(
                    "slurm listing left out %d job(s) Slurm still has (%s): an empty or truncated answer",
                    len(known),
                    ", ".join(str(i) for i in sorted(known)),
                )

        now = time.monotonic()
        for i, v in seen.items():
            if v.phase is Phase.ENDED:
                self._final[i] = (v, now)
        for job_id in set(self._views) | set(seen):
            ov = self._overrides.get(job_id)
            if ov is not None and ov.at >= start:
                continue  # changed here after this listing was taken: keep the local view
            self._overrides.pop(job_id, None)
            if job_id in seen:
                self._set(job_id, seen[job_id])
                continue
            final = self._final.get(job_id)
            if final is not None:
                self._set(job_id, final[0])
                continue
            if job_id not in gone:
                continue
            old = self._views[job_id]
            text = FORGOTTEN if highest >= job_id else NEVER_HAD if highest else NO_JOBS
            view = ObjectView(
                id=old.id,
                job=old.job,
                submission=old.submission,
                phase=Phase.ENDED,
                cause=Cause(kind=CauseKind.UNKNOWN, detail=text.format(id=old.id)),
                cancelled=False,
                restarts=old.restarts,
                started_at=old.started_at,
            )
            self._final[job_id] = (view, now)
            self._set(job_id, view)
        self._prune(seen, now)

    def _prune(self, seen: dict[int, ObjectView], now: float) -> None:
        for job_id, (_, at) in list(self._final.items()):
            if job_id not in seen and now - at > self.remember_seconds:
                del self._final[job_id]
                self._verdicts.pop(job_id, None)
                self._usable_at.pop(job_id, None)
                view = self._views.pop(job_id, None)
                if view is not None:
                    ids = self._by_job.get(view.job)
                    if ids is not None:
                        ids.discard(job_id)
                        if not ids:
                            del self._by_job[view.job]

    def _cancel_later(self, job_id: int) -> None:
        if self._cancel_stuck is None or job_id in self._cancelling or self._closed:
            return
        self._cancelling.add(job_id)
        cancel = self._cancel_stuck

        async def run() -> None:
            try:
                await cancel(job_id)
            except Exception as e:
                log.warning("could not cancel stuck Slurm job %s: %s", job_id, e)
            finally:
                self._cancelling.discard(job_id)

        task = asyncio.get_running_loop().create_task(run())
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    def _wake(self, job: str) -> None:
        wakes = self._subs.get(job)
        for wake in list(wakes) if wakes else ():
            try:
                wake()
            except Exception:
                log.exception("wake callback of job %s failed", job)
        if not wakes:
            for other in self._others:
                try:
                    other(job)
                except Exception:
                    log.exception("wake callback for job %s (no subscriber) failed", job)


def _retrieve(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()

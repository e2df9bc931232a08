"""The Slurm bridge: a :class:`~dispatch._protocols.Backend` over slurmrestd.

Objects are Slurm batch jobs, submitted held and tagged (``name`` ``dispatch-<job>-<n>``, ``comment``
``dispatch:job=<job>;submission=<n>``), released by an update, ended by a cancel. One shared poller
lists every job once per cycle for all supervised jobs. See docs/slurm.md for the state mapping.
"""

from __future__ import annotations

import asyncio
import builtins
import dataclasses
import logging
import shlex
from collections.abc import Callable, Mapping
from typing import Final

import httpx

from ..._errors import BackendError, OutsideLimits, TransientBackendError
from ..._model import Capabilities, Cause, CauseKind, JobSpec, ObjectView, Phase, Plan
from .._kit import identity_env
from . import BACKEND, CAPABILITIES, SlurmConfig, SlurmOptions, SlurmTenant
from ._dialects import PROBE_ORDER, V0038, V0040, Dialect, SlurmJob, SubmitRequest, dialect_for
from ._poller import Listing, Poller, make_tag
from ._rest import (
    ESLURM_ACCESS_DENIED,
    ESLURM_ALREADY_DONE,
    ESLURM_INVALID_JOB_ID,
    ESLURM_JOB_FINISHED,
    ESLURM_JOB_HELD,
    ESLURM_REQUESTED_PART_CONFIG_UNAVAILABLE,
    PathNotServed,
    RestClient,
    SlurmApiError,
    TokenSource,
)
from ._tenants import Clients, placement, tenant_for

__all__ = ["CAPABILITIES", "SlurmBackend", "SlurmConfig", "open_adapter"]

log = logging.getLogger("dispatch.slurm")

DEFAULT_PATH: Final = "/usr/local/bin:/usr/bin:/bin"
GONE: Final = frozenset({ESLURM_INVALID_JOB_ID, ESLURM_ALREADY_DONE, ESLURM_JOB_FINISHED})
"""Answers to release/cancel that mean there is nothing (left) to do."""
NEVER_FITS: Final = frozenset({ESLURM_REQUESTED_PART_CONFIG_UNAVAILABLE, ESLURM_ACCESS_DENIED})
"""Refusals of a release that mean the job can never run as submitted (Slurm may release it anyway)."""
REFUSED_PREFIX: Final = "refused-"
"""Object ids of submissions Slurm refused: no Slurm job exists, the view carries Slurm's answer."""


class SlurmBackend:
    """A Backend over slurmrestd. Create with :func:`open_adapter` or directly from a :class:`SlurmConfig`."""

    def __init__(self, config: SlurmConfig, *, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.config = config
        self.rest = RestClient(
            url=config.url,
            socket=config.socket,
            user_name=config.user_name,
            token=TokenSource(config.token, config.token_file),
            timeout=config.request_timeout,
            transport=transport,
            ca_file=config.ca_file,
        )
        self._transport = transport
        self.clients = Clients(config, self.rest, self._tenant_client)
        """Each Slurm identity's client; ``rest`` is the configuration's own (the listing's)."""
        self._dialect: Dialect | None = dialect_for(config.api_version) if config.api_version else None
        self._dialect_lock: asyncio.Lock | None = None
        self.poller = Poller(
            self._fetch,
            interval=config.poll_interval,
            max_backoff=config.max_backoff,
            full_every=config.full_refresh_every,
            remember_seconds=config.remember_seconds,
            user_name=(config.user_name or self.rest.token.user()) if config.filter_user else None,
            owner_of=self.clients.owner if config.tenants else None,
            cancel_stuck=self._cancel_stuck,
            lookup=self._lookup,
        )
        self.ended_by_dispatch: set[str] = set()
        """Object ids dispatch itself cancelled (ObjectView.cancelled is True for any cancel)."""
        self._refused: dict[str, list[ObjectView]] = {}
        """Submissions Slurm refused, by job: their views (no Slurm job exists)."""
        self._update_time_ok = True
        """False once the server refused ``update_time`` (24.11's v0.0.40/41 answer 422)."""
        self.submits = 0
        """Submissions sent (for the duplicate-race figures)."""

    # ------------------------------------------------------------------ Backend protocol

    @property
    def name(self) -> str:
        return "slurm"

    @property
    def capabilities(self) -> Capabilities:
        return CAPABILITIES

    async def dialect(self) -> Dialect:
        if self._dialect is not None:
            return self._dialect
        if self._dialect_lock is None:
            self._dialect_lock = asyncio.Lock()
        async with self._dialect_lock:
            if self._dialect is None:
                self._dialect = await self._probe()
                log.info("slurmrestd speaks %s", self._dialect.version)
        return self._dialect

    async def _probe(self) -> Dialect:
        """Ask the server which API it serves: an authenticated request on each version, newest first.

        Not ``/ping``: 24.11+ answer it 200 whatever the token, so a ping proves nothing about the
        credentials every later request carries. ``/licenses`` is small and slurmctld checks the
        token: 404 means the version is not served, 401/511 (500 on 22.05) a rejected token, which
        stops the probe rather than trying older versions.
        """
        for version in PROBE_ORDER:
            d = dialect_for(version)
            try:
                await self.rest.request("GET", d.probe_path(), what=f"probe API {version}")
            except PathNotServed:
                continue
            return d
        raise TransientBackendError(
            f"slurmrestd serves none of the API versions this adapter speaks ({', '.join(PROBE_ORDER)})"
        )

    def _tenant_client(self, tenant: SlurmTenant) -> RestClient:
        return RestClient(
            url=self.config.url,
            user_name=tenant.user_name,
            token=TokenSource(tenant.token, tenant.token_file),
            timeout=self.config.request_timeout,
            transport=self._transport,
            ca_file=self.config.ca_file,
        )

    def _client_of(self, job_id: int) -> RestClient:
        """The client of the identity the Slurm job ``job_id`` was submitted as."""
        view = self.poller.view(job_id)
        return self.clients.of(view.job) if view is not None else self.rest

    def admit(self, job: str, spec: JobSpec) -> None:
        """Raise :class:`OutsideLimits` when ``job``'s namespace may not run ``spec`` on Slurm."""
        tenant_for(self.config, job, spec)

    async def create(self, job: str, submission: int, spec: JobSpec, plan: Plan) -> str:
        d = await self.dialect()
        try:
            tenant = tenant_for(self.config, job, spec)
        except OutsideLimits as e:
            return self._refuse(job, submission, str(e))
        req = self.submit_request(job, submission, spec)
        if tenant is not None:
            req = self._placed(req, tenant, spec)
        what = f"submit job {job} submission {submission}"
        self.submits += 1
        try:
            resp = await self.clients.of(job).request(
                "POST",
                d.submit_path(),
                body=d.submit_body(req),
                what=what,
                accept=(ESLURM_JOB_HELD, ESLURM_REQUESTED_PART_CONFIG_UNAVAILABLE),
            )
        except SlurmApiError as e:
            # A definite no (a partition that does not exist, a value Slurm cannot parse): nothing
            # was created and retrying cannot help. The refusal becomes the submission's object, ended,
            # so the record says why rather than supervision stopping.
            return self._refuse(job, submission, str(e))
        job_id = d.parse_submit(resp.body)
        if job_id is None:
            raise TransientBackendError(
                self.rest.scrub(f"slurmrestd: {what}: no job id in the answer: {resp.error_text()}")
            )
        self.poller.note_created(job_id, job, submission)
        return str(job_id)

    def _refuse(self, job: str, submission: int, message: str) -> str:
        views = self._refused.setdefault(job, [])
        oid = f"{REFUSED_PREFIX}{submission}-{len(views) + 1}"
        kind = CauseKind.NO_CAPACITY if "[2015]" in message else CauseKind.LAUNCH_FAILED
        cause = Cause(kind=kind, detail=f"Slurm refused the submission: {message}"[:1024])
        views.append(ObjectView(id=oid, job=job, submission=submission, phase=Phase.ENDED, cause=cause))
        log.warning("job %s submission %s: %s", job, submission, message)
        return oid

    def _placed(self, req: SubmitRequest, tenant: SlurmTenant, spec: JobSpec) -> SubmitRequest:
        """``req`` where ``tenant`` puts it: its default partition and directory, its account and QoS."""
        where = placement(self.config, tenant, BACKEND.options_of(spec))
        cwd = where.working_directory
        return dataclasses.replace(
            req,
            partition=where.partition,
            working_directory=cwd,
            standard_output=self.config.standard_output or f"{cwd.rstrip('/')}/dispatch-%j.out",
            extra={**req.extra, **where.extra},
        )

    def submit_request(self, job: str, submission: int, spec: JobSpec) -> SubmitRequest:
        opts: SlurmOptions | None = BACKEND.options_of(spec)
        env: dict[str, str] = {"PATH": DEFAULT_PATH}
        if opts is not None:
            env.update(opts.environment)
        # The submission's identity: a DispatchJob's job is <namespace>/<name>; a library job has
        # no namespace.
        namespace, _, name = job.rpartition("/")
        env.update(identity_env(namespace, name, submission))
        cwd = (opts.working_directory if opts is not None else None) or self.config.working_directory
        command = shlex.join(spec.command)
        # A warning goes to the job's steps (slurmrestd cannot address the batch shell): the
        # program runs as one when it asks for a warning, as on more than one node.
        launcher = "srun " if spec.nodes > 1 or spec.stop.warning_seconds is not None else ""
        script = f"#!/bin/bash\nexec {launcher}{command}\n"
        return SubmitRequest(
            script=script,
            name=f"dispatch-{job}-{submission}",
            comment=make_tag(job, submission),
            environment=env,
            hold=True,
            partition=(opts.partition if opts is not None else None) or self.config.partition,
            time_limit_minutes=-(-spec.time_limit_seconds // 60) if spec.time_limit_seconds else None,
            warning=(
                (spec.stop.warning_signal.short, spec.stop.warning_seconds)
                if spec.stop.warning_seconds is not None
                else None
            ),
            cpus_per_task=opts.cpus_per_task if opts is not None else None,
            memory_per_node_mb=opts.memory_per_node_mb if opts is not None else None,
            nodes=spec.nodes,
            working_directory=cwd,
            standard_output=self.config.standard_output or f"{cwd.rstrip('/')}/dispatch-%j.out",
        )

    async def release(self, object_id: str) -> None:
        if object_id.startswith(REFUSED_PREFIX):
            return
        d = await self.dialect()
        job_id = _job_id(object_id)
        try:
            resp = await self._client_of(job_id).request(
                "POST",
                d.job_path(job_id),
                body=d.release_body(),
                what=f"release Slurm job {job_id}",
                accept=GONE,
            )
            refusals = [(c, t) for c, t in d.check_update(resp.body) if c not in GONE]
            if refusals:
                code, text = refusals[0]
                raise SlurmApiError(
                    f"slurmrestd: release Slurm job {job_id}: [{code}] {text}", frozenset({code})
                )
        except SlurmApiError as e:
            await self._refused_release(job_id, e)
            return
        self.poller.note_released(job_id)

    async def _refused_release(self, job_id: int, error: SlurmApiError) -> None:
        """Slurm refused the release: the job cannot run as submitted (and Slurm may have released
        it anyway). Cancel it, then record the refusal as how it ended; the supervisor goes on."""
        never_fits = bool(error.numbers & NEVER_FITS)
        kind = CauseKind.NO_CAPACITY if never_fits else CauseKind.LAUNCH_FAILED
        why = "can never run as submitted" if never_fits else "Slurm refused to release it"
        try:
            await self._client_of(job_id).request(
                "DELETE", self._d().job_path(job_id), what=f"cancel refused Slurm job {job_id}", accept=GONE
            )
        except SlurmApiError as e:
            raise TransientBackendError(str(e)) from None  # not cancelled yet: the release is retried
        cur = self.poller.view(job_id)
        if cur is None:
            raise TransientBackendError(f"release Slurm job {job_id}: refused, and the job is not known here")
        detail = f"{why}: {error} (dispatch cancelled it)"[:1024]
        view = cur.model_copy(update={"phase": Phase.ENDED, "cause": Cause(kind=kind, detail=detail)})
        self.poller.note_verdict(job_id, view)
        log.warning("Slurm job %s: %s", job_id, detail)

    def _d(self) -> Dialect:
        assert self._dialect is not None
        return self._dialect

    async def end(self, object_id: str, *, grace_seconds: int | None = None) -> None:
        # (the grace is the cluster's KillWait: see docs/slurm.md, "Time limits, the warning and the stop")
        if object_id.startswith(REFUSED_PREFIX):
            return
        d = await self.dialect()
        job_id = _job_id(object_id)
        try:
            await self._client_of(job_id).request(
                "DELETE", d.job_path(job_id), what=f"cancel Slurm job {job_id}", accept=GONE
            )
        except SlurmApiError as e:
            # Never a reason to stop: a cancel that did not happen is retried with backoff.
            raise TransientBackendError(str(e)) from None
        self.ended_by_dispatch.add(object_id)
        self.poller.mark_dirty(job_id)

    async def end_many(self, object_ids: builtins.list[str]) -> None:
        """Cancel several objects: one bulk request where the dialect has one (v0.0.40+), else one each."""
        d = await self.dialect()
        object_ids = [o for o in object_ids if not o.startswith(REFUSED_PREFIX)]
        ids = [_job_id(o) for o in object_ids]
        bulk = d.bulk_cancel(ids)
        if bulk is None or not ids or self.config.tenants:
            # With identities, each cancel carries the token of its job's own.
            for o in object_ids:
                await self.end(o)
            return
        path, body = bulk
        try:
            await self.rest.request("DELETE", path, body=body, what=f"cancel Slurm jobs {ids}", accept=GONE)
        except SlurmApiError as e:
            raise TransientBackendError(str(e)) from None
        for o, j in zip(object_ids, ids, strict=True):
            self.ended_by_dispatch.add(o)
            self.poller.mark_dirty(j)

    async def list(self, job: str) -> builtins.list[ObjectView]:
        await self.dialect()
        views = await self.poller.list(job)
        refused = self._refused.get(job)
        return [*views, *refused] if refused else views

    def subscribe(self, job: str, wake: Callable[[], None]) -> Callable[[], None]:
        return self.poller.subscribe(job, wake)

    def subscribe_others(self, wake: Callable[[str], None]) -> Callable[[], None]:
        return self.poller.subscribe_others(wake)

    async def aclose(self) -> None:
        await self.poller.aclose()
        await self.rest.aclose()
        for client in self.clients.by_tenant.values():
            await client.aclose()

    async def __aenter__(self) -> SlurmBackend:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ------------------------------------------------------------------ internals

    async def _fetch(self, update_time: int | None) -> Listing:
        d = await self.dialect()
        # 24.11's v0.0.40 and v0.0.41 refuse update_time (422, "Parsing of ... for timestamp failed").
        if not d.update_time_accepted or not self._update_time_ok:
            update_time = None
        params = {"update_time": update_time} if update_time is not None else None
        try:
            resp = await self.rest.request("GET", d.jobs_path(), params=params, what="list jobs")
        except SlurmApiError as e:
            if params is not None and e.numbers & {9000, 9202}:
                self._update_time_ok = False
                log.info("slurmrestd refuses update_time (%s): listing in full from now on", e)
                return await self._fetch(None)
            raise TransientBackendError(str(e)) from None
        if resp.status == 304:
            return Listing(None)
        jobs = d.parse_jobs(resp.body)
        last = _last_update(resp.body)
        if params is not None and not jobs and not isinstance(d, V0038) and not last:
            return Listing(None)  # v0.0.42+: "no job changes since update_time" is an empty 200
        return Listing(jobs, last)

    async def _lookup(self, ids: builtins.list[int]) -> tuple[dict[int, SlurmJob | None], int]:
        """Which of ``ids`` Slurm still knows: one ``GET /jobs/state`` (v0.0.40+: ids and states
        only, the cheapest call that answers it), or ``GET /job/{id}`` each on v0.0.38."""
        d = await self.dialect()
        path = d.lookup_path()
        wanted = set(ids)
        if path is not None and isinstance(d, V0040):
            try:
                resp = await self.rest.request("GET", path, what="look up job states")
            except SlurmApiError as e:
                raise TransientBackendError(str(e)) from None
            states = d.parse_states(resp.body)
            return {i: None for i in states if i in wanted}, max(states, default=0)
        out: dict[int, SlurmJob | None] = {}
        for i in sorted(wanted):
            try:
                resp = await self.rest.request("GET", d.job_path(i), what=f"look up Slurm job {i}")
            except SlurmApiError as e:
                if e.numbers & GONE:
                    continue
                raise TransientBackendError(str(e)) from None
            found = [j for j in d.parse_jobs(resp.body) if j.job_id == i]
            if found:
                out[i] = found[0]
        return out, 0

    async def _cancel_stuck(self, job_id: int) -> None:
        d = await self.dialect()
        log.info("cancelling Slurm job %s: it can never run", job_id)
        await self._client_of(job_id).request(
            "DELETE", d.job_path(job_id), what=f"cancel stuck Slurm job {job_id}", accept=GONE
        )
        self.poller.mark_dirty(job_id)


def _last_update(body: Mapping[str, object]) -> int | None:
    v = body.get("last_update")
    if isinstance(v, dict):
        v = v.get("number") if v.get("set", True) else None
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def _job_id(object_id: str) -> int:
    try:
        return int(object_id)
    except ValueError:
        raise BackendError(f"not a Slurm job id: {object_id!r}") from None


def open_adapter(config: Mapping[str, object]) -> SlurmBackend:
    """The ``slurm`` entry point of ``dispatch.adapters``."""
    return SlurmBackend(SlurmConfig.model_validate(dict(config)))


_ = TransientBackendError  # re-exported for callers that catch it from here

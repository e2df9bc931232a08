"""Slurm identities by namespace: which token and user a job's requests carry, and its limits.

One listing serves every identity: the operator's own token lists all jobs once per cycle, and the
poller keeps a tagged job only when its Slurm owner is the identity of the tagged job's namespace.
Submits, releases and cancels carry the identity's token and user, so Slurm itself refuses a
cancel of another identity's job. Each identity has one client (one connection pool), made when
the adapter opens; its token file is re-read when it changes, so a rotated Secret needs no restart.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from ..._errors import OutsideLimits
from ..._model import JobSpec
from . import BACKEND, SlurmChange, SlurmConfig, SlurmOptions, SlurmTenant
from ._rest import RestClient


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a submission of a job runs, as its identity allows."""

    partition: str | None
    working_directory: str
    extra: Mapping[str, str]
    """Fields of the submission the identity sets (``account``, ``qos``)."""


def namespace_of(job: str) -> str:
    """A DispatchJob's job id is ``<namespace>/<name>``; a library job has no namespace."""
    return job.rpartition("/")[0]


def _under(path: str, prefixes: tuple[str, ...]) -> bool:
    norm = posixpath.normpath(path)
    return any(norm == p.rstrip("/") or norm.startswith(p.rstrip("/") + "/") for p in prefixes)


def _partitions(spec: JobSpec) -> Iterator[tuple[str, str]]:
    """Every partition the job may be submitted to, with the field naming it."""
    opts: SlurmOptions | None = BACKEND.options_of(spec)
    if opts is not None and opts.partition is not None:
        yield "spec.slurm.partition", opts.partition
    for i, rule in enumerate(spec.recovery.rules):
        change = rule.change.options.get("slurm") if rule.change is not None else None
        if isinstance(change, SlurmChange) and change.partition is not None:
            yield f"spec.recovery.rules[{i}].change.slurm.partition", change.partition


def tenant_for(config: SlurmConfig, job: str, spec: JobSpec) -> SlurmTenant | None:
    """The identity ``job`` runs as, having checked ``spec`` is within its limits (None: the
    configuration has no tenants, and every job runs as its one identity).

    Raises :class:`OutsideLimits` naming the field that is not allowed.
    """
    if not config.tenants:
        return None
    namespace = namespace_of(job)
    tenant = config.tenant_of(namespace)
    if tenant is None:
        raise OutsideLimits(f"spec.backend: slurm has no Slurm identity for namespace {namespace!r}")
    who = f"Slurm identity {tenant.name!r} (namespace {namespace})"
    if tenant.partitions:
        for field, partition in _partitions(spec):
            if partition not in tenant.partitions:
                raise OutsideLimits(
                    f"{field}: {partition!r} is not a partition {who} may use "
                    f"({', '.join(tenant.partitions)})"
                )
    limit = tenant.max_time_limit_seconds
    asked = spec.time_limit_seconds
    if limit is not None and asked is None:
        raise OutsideLimits(f"spec.timeLimitSeconds: required by {who}: at most {limit}")
    if limit is not None and asked is not None and asked > limit:
        raise OutsideLimits(f"spec.timeLimitSeconds: {asked} is over the {limit} {who} may use")
    for i, rule in enumerate(spec.recovery.rules):
        longer = rule.change.time_limit if rule.change is not None else None
        if limit is not None and longer is not None and longer.max_seconds > limit:
            raise OutsideLimits(
                f"spec.recovery.rules[{i}].change.timeLimit.maxSeconds: {longer.max_seconds} is over "
                f"the {limit} {who} may use"
            )
    opts: SlurmOptions | None = BACKEND.options_of(spec)
    if tenant.max_nodes is not None and spec.nodes > tenant.max_nodes:
        raise OutsideLimits(f"spec.nodes: {spec.nodes} is over the {tenant.max_nodes} {who} may use")
    cwd = opts.working_directory if opts is not None else None
    allowed = tenant.working_directories or (config.working_directory,)
    if cwd is not None and not _under(cwd, allowed):
        raise OutsideLimits(
            f"spec.slurm.workingDirectory: {cwd!r} is not under a directory {who} may use "
            f"({', '.join(allowed)})"
        )
    return tenant


def placement(config: SlurmConfig, tenant: SlurmTenant | None, opts: SlurmOptions | None) -> Placement:
    """The partition, working directory and billing of a submission: the spec's, else the
    identity's defaults (its first partition and directory), else the configuration's."""
    partition = opts.partition if opts is not None else None
    cwd = opts.working_directory if opts is not None else None
    extra: dict[str, str] = {}
    if tenant is not None:
        partition = partition or (tenant.partitions[0] if tenant.partitions else None)
        cwd = cwd or (tenant.working_directories[0] if tenant.working_directories else None)
        if tenant.account is not None:
            extra["account"] = tenant.account
        if tenant.qos is not None:
            extra["qos"] = tenant.qos
    return Placement(partition or config.partition, cwd or config.working_directory, extra)


class Clients:
    """One client per identity, made once: a job's requests go through its namespace's."""

    def __init__(
        self, config: SlurmConfig, default: RestClient, make: Callable[[SlurmTenant], RestClient]
    ) -> None:
        self._config = config
        self.default = default
        """The configuration's own identity: every job's without tenants, else the listing's."""
        self.by_tenant = {t.name: make(t) for t in config.tenants}

    def of(self, job: str) -> RestClient:
        """The client of ``job``'s identity: the default one without tenants. A namespace without
        an identity also gets the default, for cancels only: its jobs are refused at submission,
        and the listing adopts no job of it (:meth:`owner`), so none is ever released."""
        tenant = self._config.tenant_of(namespace_of(job)) if self._config.tenants else None
        return self.by_tenant[tenant.name] if tenant is not None else self.default

    def owner(self, job: str) -> str | None:
        """The Slurm user a tagged job of ``job`` must belong to (None: the configuration's one
        check; ``""``, a namespace without an identity: no user, so no job is adopted)."""
        if not self._config.tenants:
            return None
        tenant = self._config.tenant_of(namespace_of(job))
        return tenant.user_name if tenant is not None else ""

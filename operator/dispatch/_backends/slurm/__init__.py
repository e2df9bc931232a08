"""The ``slurm`` backend's declaration: batch jobs on Slurm through slurmrestd."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, ClassVar, Final, Self

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from ..._model import MAX_LIMIT_SECONDS, Capabilities, OptionsChange, OptionsModel
from ..._registry import BackendInfo, Where
from .._kit import UserEnv, refuse_reserved_env

Partition = Annotated[str, Field(min_length=1, max_length=64)]
MIB: Final = 1 << 20
"""Slurm's unit of memory (its "MB" is a mebibyte)."""

CAPABILITIES: Final = Capabilities(
    time_limit=(
        "Slurm's time limit, in whole minutes (rounded up): at it Slurm sends SIGTERM, then SIGKILL"
        " after the cluster's KillWait, and the job ends TIMEOUT"
    ),
    warning_signal=True,
    stop_grace=(
        "the cluster's KillWait: scancel sends SIGTERM, then SIGKILL after KillWait, as Slurm's own"
        " time limit and preemption do"
    ),
)
"""Slurm enforces no recovery rule exactly: its MaxBatchRequeue limit is checked on launch-failure
and node-failure requeues but not on preemption requeues (PreemptMode=REQUEUE raises restart_cnt
unchecked), so a budget is not exact for preemption; and a job's requeue flag allows node-failure
requeues only together with preemption requeues, so [node-lost] alone is not exact either. Every
rule goes to the supervisor, and a restart rule is refused by the plan; jobs are submitted
``no_requeue`` (a REQUEUE-mode preemption ends them PREEMPTED). See docs/slurm.md."""


class SlurmOptions(OptionsModel):
    """How to run on Slurm: partition, limits, environment and working directory."""

    REPLACED: ClassVar[Mapping[str, str]] = {"timeLimitMinutes": "spec.timeLimitSeconds"}

    partition: Partition | None = None
    """The partition (default: the configuration's, else Slurm's default partition)."""
    cpus_per_task: Annotated[int, Field(ge=1, le=4096)] | None = None
    memory_per_node_mb: Annotated[int, Field(ge=1, le=1 << 24)] | None = None
    environment: UserEnv = Field(default_factory=dict)
    """The job's environment (names with the prefix ``DISPATCH_`` are dispatch's own: ``DISPATCH_JOB``,
    ``DISPATCH_NAMESPACE``, ``DISPATCH_SUBMISSION``)."""
    working_directory: Annotated[str, Field(min_length=1, max_length=4096)] | None = None

    memory_field: ClassVar[str | None] = "memoryPerNodeMb"

    def memory_bytes(self) -> int | None:
        return self.memory_per_node_mb * MIB if self.memory_per_node_mb is not None else None

    def with_memory_bytes(self, value: int) -> Self:
        """``memoryPerNodeMb`` as ``value`` bytes, rounded down to Slurm's unit (MiB): never above
        a change's max."""
        mb = max(value // MIB, self.memory_per_node_mb or 0)
        return self.model_copy(update={"memory_per_node_mb": mb})

    @field_validator("environment")
    @classmethod
    def _reserved_env(cls, env: dict[str, str]) -> dict[str, str]:
        refuse_reserved_env(env)
        return env


class SlurmChange(OptionsChange):
    """What a rule's firing may change of a Slurm job's options: each field set replaces the one of
    ``spec.slurm`` for the submission it authorizes and the ones after it."""

    options_model: ClassVar[type[OptionsModel]] = SlurmOptions

    partition: Partition | None = None
    """Another partition (one with more capacity, or longer limits)."""


Prefix = Annotated[str, Field(min_length=2, max_length=4096, pattern=r"^/")]


class SlurmTenant(BaseModel):
    """One Slurm identity, its namespaces and its limits: a DispatchJob of one of ``namespaces`` is
    submitted, released and cancelled with this token as ``user_name``, and only within the limits
    (checked at apply by the webhook, and again at submission)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: Annotated[str, Field(min_length=1, max_length=63)]
    """What messages and logs call the identity."""
    namespaces: Annotated[tuple[Annotated[str, Field(min_length=1, max_length=63)], ...], Field(min_length=1)]
    user_name: Annotated[str, Field(min_length=1)]
    """The Slurm user its jobs run as (must match the token's ``sun`` claim)."""
    token: SecretStr | None = None
    token_file: str | None = None
    """A file holding its JWT (a mounted Secret); re-read when its mtime changes, so a rotated
    Secret takes effect without a restart."""
    account: str | None = None
    """The Slurm account every job of the identity is billed to (None: the user's default)."""
    qos: str | None = None
    """The QoS every job of the identity runs with (None: the account's default)."""
    partitions: tuple[Partition, ...] = ()
    """The partitions it may name (the first is its default); empty: any."""
    max_time_limit_seconds: Annotated[int, Field(ge=1, le=MAX_LIMIT_SECONDS)] | None = None
    """The longest ``spec.timeLimitSeconds`` it may ask; a job must then name one."""
    max_nodes: Annotated[int, Field(ge=1)] | None = None
    working_directories: tuple[Prefix, ...] = ()
    """Directory prefixes a ``spec.slurm.workingDirectory`` must lie under (the first is its
    default); empty: the configuration's ``working_directory`` only."""

    @model_validator(mode="after")
    def _one_token(self) -> SlurmTenant:
        if (self.token is None) == (self.token_file is None):
            raise ValueError(f"tenant {self.name!r}: give exactly one of 'token' and 'token_file'")
        return self


class SlurmConfig(BaseModel):
    """How to reach slurmrestd and how to submit. Secrets are :class:`~pydantic.SecretStr`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str | None = None
    """e.g. ``https://slurmrestd.example:6820``. Exactly one of ``url`` and ``socket``. The token
    travels in a header: over ``http://`` anyone on the path reads it, so use ``https://`` (a TLS
    proxy in front of slurmrestd, or slurmrestd's own TLS) anywhere but a trusted host."""
    ca_file: str | None = None
    """A PEM file of the CA certificates that sign slurmrestd's (a site's private CA, a mounted
    Secret or ConfigMap); only with an ``https://`` url. Default: the system's trust store."""
    socket: str | None = None
    """A unix socket path (rest_auth/local: no token needed)."""
    user_name: str | None = None
    """``X-SLURM-USER-NAME``: the user jobs run as (must match the token)."""
    token: SecretStr | None = None
    token_file: str | None = None
    """A file holding the JWT (a mounted Secret); re-read when its mtime changes."""
    api_version: str | None = None
    """``v0.0.38``, ``v0.0.40`` ... ``v0.0.45``; None asks the server (newest it serves first)."""
    poll_interval: Annotated[float, Field(gt=0, le=3600)] = 2.0
    max_backoff: Annotated[float, Field(gt=0, le=3600)] = 60.0
    request_timeout: Annotated[float, Field(gt=0, le=600)] = 10.0
    full_refresh_every: Annotated[int, Field(ge=1)] = 30
    """Every n-th cycle lists without ``update_time`` (a guard against clock skew)."""
    remember_seconds: Annotated[float, Field(gt=0)] = 86400.0
    """How long the final state of an ended job is remembered after Slurm forgets it."""
    partition: str | None = None
    """Default partition when the spec names none."""
    working_directory: str = "/tmp"
    """Default working directory when the spec names none."""
    standard_output: str | None = None
    """Output path pattern; default ``<working directory>/dispatch-%j.out``.

    Not ``%x`` (the job name): dispatch names jobs ``dispatch-<job>-<n>`` and a job id of the operator
    is ``<namespace>/<name>``, whose ``/`` would make a path Slurm cannot open.
    """
    filter_user: bool = True
    """Only consider tagged jobs owned by ``user_name``, or else by the user the token was minted
    for (its ``sun`` claim): a job another Slurm user submitted with a copied tag (job names and
    comments are visible to every user in ``squeue``) is reported, never adopted or cancelled."""
    tenants: tuple[SlurmTenant, ...] = ()
    """Slurm identities by namespace. When any is given, a job runs only as its namespace's
    identity and a namespace without one runs nothing; ``user_name`` and the token above are then
    the operator's own identity, which only lists jobs (it must see every identity's jobs: a Slurm
    operator or administrator where ``PrivateData=jobs``). See docs/slurm.md."""

    @model_validator(mode="after")
    def _one_endpoint(self) -> SlurmConfig:
        if (self.url is None) == (self.socket is None):
            raise ValueError("give exactly one of 'url' and 'socket'")
        if self.token is not None and self.token_file is not None:
            raise ValueError("give at most one of 'token' and 'token_file'")
        if self.ca_file is not None and not (self.url or "").startswith("https://"):
            raise ValueError(
                "'ca_file' is for an https:// url: slurmrestd's certificate is checked against it"
            )
        if self.tenants:
            if self.socket is not None:
                raise ValueError("'tenants' need 'url': over a socket every job runs as slurmrestd's user")
            if self.token is None and self.token_file is None:
                raise ValueError(
                    "'tenants' need the operator's own 'token' or 'token_file', which lists jobs"
                )
            seen: dict[str, str] = {}
            for tenant in self.tenants:
                for ns in tenant.namespaces:
                    if ns in seen:
                        raise ValueError(f"namespace {ns!r} is in tenants {seen[ns]!r} and {tenant.name!r}")
                    seen[ns] = tenant.name
        return self

    def tenant_of(self, namespace: str) -> SlurmTenant | None:
        """The identity jobs of ``namespace`` run as (None: none configured for it)."""
        return next((t for t in self.tenants if namespace in t.namespaces), None)


BACKEND: Final = BackendInfo(
    name="slurm",
    summary="batch jobs on Slurm through slurmrestd, configured with --slurm-config",
    where=Where.EXTERNAL,
    capabilities=CAPABILITIES,
    open="dispatch._backends.slurm._adapter:open_adapter",
    options=SlurmOptions,
    change=SlurmChange,
)

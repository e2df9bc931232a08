"""The model: pydantic v2 types that are the single source for the API, the CRD schema and the docs.

Everything here is immutable (frozen models, tuples) so a record can be shared between versions,
between the store and its readers, without anyone changing it behind the store's back.
Field names are snake_case in Python and camelCase on the wire (the CRD, the CR's status).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from enum import StrEnum
from fractions import Fraction
from typing import TYPE_CHECKING, Annotated, ClassVar, Final, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializeAsAny,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

MAX_BUDGET: Final = 100
"""Budgets above this are refused as absurd: a job preempted a hundred times needs a person."""
MAX_NODES: Final = 1024
MAX_RULES: Final = 16
NAME_PATTERN: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
MAX_NAME_LENGTH: Final = 48
"""Leaves room for the suffixes of the objects dispatch creates within Kubernetes' 63 characters."""
KUEUE_NAME_PATTERN: Final = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
"""A LocalQueue's or WorkloadPriorityClass's name as Kueue takes it in a label value: a DNS-1123
subdomain (jobframework's ValidateLabelAsCRDName) of at most 63 characters (a label value's limit)."""
MAX_KUEUE_NAME_LENGTH: Final = 63


class _Model(BaseModel):
    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        use_enum_values=False,
    )


class OptionsModel(_Model):
    """The base of a backend's options model (``spec.<backend>``): frozen, camelCase on the wire,
    unknown keys refused, like every model of the API. A field's attribute docstring is its
    description (in the CRD and docs/api.md), inherited by the subclasses that share the field.

    Options that hold the memory of each node say where (:attr:`memory_field`) and implement
    :meth:`memory_bytes` and :meth:`with_memory_bytes`: a rule's ``change.memory`` scales it
    through them, so the core knows no backend's field."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    REPLACED: ClassVar[Mapping[str, str]] = {}
    """Fields a backend's options once had (their wire names), each with the field of the spec that
    replaced it: refused at apply with an error naming the new field, in the CRD and here."""

    @model_validator(mode="before")
    @classmethod
    def _refuse_replaced(cls, data: object) -> object:
        if isinstance(data, dict):
            for old, new in cls.REPLACED.items():
                snake = "".join(f"_{c.lower()}" if c.isupper() else c for c in old)
                if old in data or snake in data:
                    raise ValueError(f"{old} is replaced by {new}")
        return data

    def gpus_per_node(self) -> int:
        """The GPUs each node of a submission holds, as these options ask for them: what a
        submission that did not succeed cost in GPU-seconds (0 where the options ask for none)."""
        return 0

    memory_field: ClassVar[str | None] = None
    """The field (its wire path under ``spec.<backend>``) that holds the memory of each node; None
    where the options hold none (then no rule can change the memory)."""

    def memory_bytes(self) -> int | None:
        """The memory of each node these options ask for, in bytes; None when they ask for none."""
        return None

    def with_memory_bytes(self, value: int) -> Self:
        """These options asking for ``value`` bytes of memory per node (rounded down to the unit of
        :attr:`memory_field`, never below what they ask for now)."""
        raise TypeError(f"{type(self).__name__} holds no memory a rule could change")


class OptionsChange(OptionsModel):
    """The base of a backend's change model (``change.<backend>`` of a rule): each field it sets
    replaces the field of the same name in the backend's options (:attr:`options_model`) for the
    submission the rule's firing authorizes, and for the ones after it."""

    options_model: ClassVar[type[OptionsModel]]
    """The backend's options model, whose fields these replace (used when the spec holds none)."""


class CauseKind(StrEnum):
    """Why an execution ended. The order of the members is the canonical order of ``uncovered``."""

    PREEMPTED = "preempted"
    NODE_LOST = "node-lost"
    OUT_OF_MEMORY = "out-of-memory"
    TIME_LIMIT = "time-limit"
    NON_ZERO_EXIT = "non-zero-exit"
    LAUNCH_FAILED = "launch-failed"
    NO_CAPACITY = "no-capacity"
    REQUEUED = "requeued"
    UNKNOWN = "unknown"
    DEADLINE_EXCEEDED = "deadline-exceeded"
    """The job's deadline (``spec.deadlineSeconds``) has passed: no rule can cover it."""
    NONE = "none"
    """Success: not a cause a rule can cover."""


FAILURE_CAUSES: Final = tuple(c for c in CauseKind if c is not CauseKind.NONE)
RULE_CAUSES: Final = tuple(c for c in FAILURE_CAUSES if c is not CauseKind.DEADLINE_EXCEEDED)
"""The causes a rule may cover: every failure but the deadline's, after which nothing is resubmitted."""


class StopKind(StrEnum):
    """How a stop dispatch made went: the program exited within its grace period after SIGTERM
    (``graceful``), or was killed with SIGKILL at the grace period's end (``forced``)."""

    GRACEFUL = "graceful"
    FORCED = "forced"


class Action(StrEnum):
    """What a rule does when it fires.

    ``resubmit`` starts the job again as a new submission with a new object; the supervisor can
    always enforce it. ``restart`` restarts the same object in place (Kubeflow's restartPolicy);
    only a scheduler that does it natively and exactly can enforce it, so the supervisor never does.
    """

    RESUBMIT = "resubmit"
    RESTART = "restart"


class ActorKind(StrEnum):
    """What kind of actor did a thing."""

    HUMAN = "human"
    SERVICE_ACCOUNT = "serviceaccount"
    """A Kubernetes service account (a CI pipeline, a GitOps controller): ``<namespace>/<name>``."""
    SUPERVISOR = "supervisor"
    SCHEDULER = "scheduler"


class Enforcer(StrEnum):
    """Who carries out a rule: the scheduler natively, or dispatch's supervisor."""

    SCHEDULER = "scheduler"
    SUPERVISOR = "supervisor"


class State(StrEnum):
    """A job's state. ``running`` and ``cancelling`` exist only in status, never in a record or its history.

    ``cancelling``: a cancel was asked for (or recorded) and objects of the job are still alive;
    status shows ``cancelled`` only once every object has ended.
    """

    PENDING = "pending"
    RUNNING = "running"
    RECOVERING = "recovering"
    SUSPENDED = "suspended"
    """A person suspended the job: its running submission is stopped and no next one is authorized
    until a person resumes it. Not an outcome."""
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    CANCELLING = "cancelling"

    @property
    def is_outcome(self) -> bool:
        return self in _OUTCOMES


_OUTCOMES: Final = frozenset({State.SUCCEEDED, State.FAILED, State.CANCELLED})
_SHOWN_ONLY: Final = frozenset({State.RUNNING, State.CANCELLING})


class Phase(StrEnum):
    """Where one scheduler object is, as the scheduler shows it."""

    HELD = "held"
    """Created, not yet released: it cannot start."""
    QUEUED = "queued"
    """Released, waiting for resources."""
    RUNNING = "running"
    ENDED = "ended"


class Actor(_Model):
    """Who did a thing: a human by name, the supervisor, the scheduler."""

    kind: ActorKind
    id: Annotated[str, Field(min_length=1, max_length=253)]

    def __str__(self) -> str:
        return f"{self.kind}:{self.id}"


SUPERVISOR: Final = Actor(kind=ActorKind.SUPERVISOR, id="supervisor")
SCHEDULER: Final = Actor(kind=ActorKind.SCHEDULER, id="scheduler")


def _is_none(value: object) -> bool:
    """A field left out of a dump while unset: a plan without backoffs reads as it did before them."""
    return value is None


class Cause(_Model):
    """Why an execution ended: its kind, the scheduler's words, and the exit code when there is one."""

    kind: CauseKind
    detail: Annotated[str, Field(max_length=1024)] = ""
    exit_code: int | None = None
    """The training container's (or Slurm job's) exit code, when it exited by itself or was
    killed with one shown (137 for an out-of-memory kill on Kubernetes)."""
    signal: int | None = None
    """The signal that killed it, when the scheduler says it died by one (SIGKILL, 9, for an
    out-of-memory kill); a plain exit has none."""
    stop: Annotated[StopKind | None, Field(exclude_if=_is_none)] = None
    """Set when the execution ended by a stop (dispatch's at a time limit, a deadline or a cancel;
    the scheduler's at its own time limit): ``graceful`` when the program exited within its grace
    period after SIGTERM, ``forced`` when it was killed at the grace period's end."""


NO_CAUSE: Final = Cause(kind=CauseKind.NONE)

MAX_BACKOFF_SECONDS: Final = 86400
"""A wait longer than a day between submissions is refused as absurd: it is a schedule, not a backoff."""
MAX_BACKOFF_FACTOR: Final = 10


class Backoff(_Model):
    """How long a rule waits before each of its firings: ``base_seconds`` before the first, times
    ``factor`` before each next one, never more than ``max_seconds``. The wait before the k-th
    firing is ``min(max_seconds, base_seconds * factor ** (k - 1))``, counted from the time the
    end that fires it was recorded."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    base_seconds: Annotated[int, Field(ge=0, le=MAX_BACKOFF_SECONDS)] = 10
    """The wait before the rule's first firing, in seconds."""
    factor: Annotated[float, Field(ge=1, le=MAX_BACKOFF_FACTOR)] = 2.0
    """What each next wait is multiplied by (1: the same wait every time)."""
    max_seconds: Annotated[int, Field(ge=0, le=MAX_BACKOFF_SECONDS)] = 600
    """The longest wait, in seconds: the cap of the growing wait."""

    def seconds(self, firing: int) -> float:
        """The wait before the rule's ``firing``-th firing (1 for the first)."""
        wait = float(self.base_seconds)
        for _ in range(max(firing - 1, 0)):
            if wait >= self.max_seconds:
                break  # capped already: multiplying on could only overflow
            wait *= self.factor
        return min(float(self.max_seconds), wait)

    def describe(self) -> str:
        """In a user's words, as the plan and ``kubectl dispatch`` show it."""
        if self.factor == 1 or self.base_seconds >= self.max_seconds:
            return f"{min(self.base_seconds, self.max_seconds)} s before each firing"
        return f"{self.base_seconds} s x {self.factor:g} per firing, at most {self.max_seconds} s"


class ExitCodeOperator(StrEnum):
    """How a rule's ``exitCodes`` compare with a cause's exit code (Kubernetes' ``onExitCodes``)."""

    IN = "In"
    NOT_IN = "NotIn"


ExitCode = Annotated[int, Field(ge=1, le=255)]


class ExitCodes(_Model):
    """The exit codes a ``non-zero-exit`` rule covers: ``In`` these values, or ``NotIn`` them (every
    other non-zero code). A cause whose code is unknown is covered only by a rule without them."""

    operator: ExitCodeOperator
    values: Annotated[tuple[ExitCode, ...], Field(min_length=1, max_length=255)]

    @field_validator("values")
    @classmethod
    def _distinct(cls, values: tuple[int, ...]) -> tuple[int, ...]:
        if len(set(values)) != len(values):
            raise ValueError("an exit code is listed twice")
        return values

    def matches(self, code: int | None) -> bool:
        """Whether a cause with exit code ``code`` is covered: never an unknown code, never 0."""
        if code is None or code == 0:
            return False
        return (code in self.values) is (self.operator is ExitCodeOperator.IN)

    def overlaps(self, other: ExitCodes) -> bool:
        """Whether some code is covered by both: two ``NotIn`` always share the codes above 255."""
        mine, theirs = frozenset(self.values), frozenset(other.values)
        if self.operator is ExitCodeOperator.IN and other.operator is ExitCodeOperator.IN:
            return bool(mine & theirs)
        if self.operator is ExitCodeOperator.IN:
            return not mine <= theirs
        if other.operator is ExitCodeOperator.IN:
            return not theirs <= mine
        return True

    def describe(self) -> str:
        return f"{self.operator} [{' '.join(str(v) for v in sorted(self.values))}]"


def cause_words(kind: str, exit_code: object = None, signal: object = None) -> str:
    """A cause's kind with its exit code and signal, the part of it a rule matches on:
    ``non-zero-exit exit code 3``, ``out-of-memory exit code 137 signal 9``."""
    code = f" exit code {exit_code}" if exit_code is not None else ""
    killed = f" signal {signal}" if signal is not None else ""
    return f"{kind}{code}{killed}"


def rule_causes(on: Sequence[CauseKind], exit_codes: ExitCodes | None) -> str:
    """A rule's causes as the plan, status and Events say them: ``preempted node-lost``, with the
    codes of a rule on exit codes (``non-zero-exit exitCodes In [137]``)."""
    causes = " ".join(c.value for c in on)
    return causes if exit_codes is None else f"{causes} exitCodes {exit_codes.describe()}"


def uncovered_codes(covering: Sequence[ExitCodes]) -> ExitCodes | None:
    """The exit codes none of ``covering`` covers, exactly (``In`` a finite set, or ``NotIn`` one:
    every other code), or None when every code is covered or ``covering`` is empty."""
    if not covering:
        return None
    taken = frozenset(v for c in covering if c.operator is ExitCodeOperator.IN for v in c.values)
    excluded = [frozenset(c.values) for c in covering if c.operator is ExitCodeOperator.NOT_IN]
    if not excluded:
        return ExitCodes(operator=ExitCodeOperator.NOT_IN, values=tuple(sorted(taken)))
    left = frozenset.intersection(*excluded) - taken
    return ExitCodes(operator=ExitCodeOperator.IN, values=tuple(sorted(left))) if left else None


class _ByBackend(_Model):
    """A model whose ``options`` field holds one model per backend, by backend name, each an instance
    of :attr:`backend_model` (the core knows no backend, so it cannot build one from a mapping):
    ``JobSpec.options`` (``spec.<backend>``) and ``Change.options`` (``change.<backend>``). Each
    may be given as a keyword too (``JobSpec(..., slurm=SlurmOptions(...))``)."""

    backend_model: ClassVar[type[OptionsModel]] = OptionsModel
    wire: ClassVar[tuple[str, str]] = ("options", "spec")
    """What the backend's model is called, and where it is on the wire: for the refusal."""

    @model_validator(mode="before")
    @classmethod
    def _options_by_backend(cls, data: object) -> object:
        """Moves each ``<backend>=<model>`` keyword into ``options``: a keyword that is not a field
        and holds an instance of :attr:`backend_model` is that backend's."""
        if not isinstance(data, dict):
            return data
        fields = {name for key, info in cls.model_fields.items() for name in (key, info.alias) if name}
        named = {k: v for k, v in data.items() if isinstance(v, cls.backend_model) and k not in fields}
        given = data.get("options") or {}
        if not named or not isinstance(given, dict):
            return data  # nothing to move, or options the field itself refuses
        twice = sorted(named.keys() & given.keys())
        if twice:
            raise ValueError(f"options of {', '.join(twice)} given twice: as a keyword and in options")
        rest = {k: v for k, v in data.items() if k not in named}
        return {**rest, "options": {**given, **named}}

    @field_validator("options", mode="before", check_fields=False)
    @classmethod
    def _built_options(cls, options: object) -> object:
        what, wire = cls.wire
        if isinstance(options, dict):
            for name, value in options.items():
                if not isinstance(value, cls.backend_model):
                    raise ValueError(
                        f"options[{name!r}] must be an instance of backend {name!r}'s {what} model, "
                        f"not {type(value).__name__} (dispatch._dispatchjob.job_spec builds it "
                        f"from {wire}.{name})"
                    )
        return options


MEMORY_PATTERN: Final = r"^[0-9]+(\.[0-9]+)?([EPTGMK]i?|[mkMGTPE])?$"
"""A Kubernetes quantity of memory (``16Gi``, ``512M``)."""
MemoryQuantity = Annotated[str, Field(max_length=32, pattern=MEMORY_PATTERN)]
MAX_MEMORY_FACTOR: Final = 16
MAX_LIMIT_SECONDS: Final = 366 * 86400
"""A time limit or deadline beyond a year is refused as absurd."""
_BINARY: Final = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL: Final = {"k": 1, "K": 1, "M": 2, "G": 3, "T": 4, "P": 5, "E": 6}


def quantity_bytes(quantity: str) -> int:
    """A memory quantity in bytes, rounded up as Kubernetes rounds a memory request (``1.5Gi``:
    1610612736, ``500m``: 1)."""
    digits = quantity.rstrip("EPTGMKik")
    suffix = quantity[len(digits) :]
    if suffix == "" and digits.endswith("m"):
        digits, suffix = digits[:-1], "m"
    number = Fraction(digits)
    if suffix in _BINARY:
        number *= 1024 ** _BINARY[suffix]
    elif suffix in _DECIMAL:
        number *= 1000 ** _DECIMAL[suffix]
    elif suffix == "m":
        number /= 1000
    return math.ceil(number)


def bytes_quantity(value: int) -> str:
    """``value`` bytes as the largest binary unit that holds it exactly (``16Gi``, ``1536Mi``, ``7``)."""
    for suffix, power in sorted(_BINARY.items(), key=lambda item: -item[1]):
        if value and value % 1024**power == 0:
            return f"{value // 1024**power}{suffix}"
    return str(value)


KueueName = Annotated[str, Field(max_length=MAX_KUEUE_NAME_LENGTH, pattern=KUEUE_NAME_PATTERN)]


class MemoryChange(_Model):
    """More memory for each next submission: the memory the previous submission had (the options'
    memory field, ``resources.memory`` on Kubernetes, ``memoryPerNodeMb`` on Slurm) times
    ``factor``, never more than ``max``, never less than before. Each firing multiplies again, so
    the k-th firing of a rule that alone changes the memory gives ``min(max, memory * factor ** k)``."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    factor: Annotated[float, Field(gt=1, le=MAX_MEMORY_FACTOR)]
    """What each firing multiplies the memory of each node by."""
    max: MemoryQuantity
    """The most memory of each node any submission gets: the cap of the growing memory."""


class TimeLimitChange(_Model):
    """A longer time limit for each next submission: the previous submission's
    ``spec.timeLimitSeconds`` times ``factor`` (rounded down to a second), never more than
    ``maxSeconds``, never less than before, as :class:`MemoryChange` grows the memory."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    factor: Annotated[float, Field(gt=1, le=MAX_MEMORY_FACTOR)]
    """What each firing multiplies the time limit by."""
    max_seconds: Annotated[int, Field(ge=1, le=MAX_LIMIT_SECONDS)]
    """The longest time limit any submission gets."""


class Change(_ByBackend):
    """What a rule's firing changes in the submission it authorizes; later submissions keep it.

    Each field that is set applies once per firing, in the order of the firings: ``memory``
    multiplies (up to its max), the others replace. A change the backend cannot make is refused
    when the job is planned, naming the field."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    memory: MemoryChange | None = None
    """More memory for each node (needs the memory in the backend's options)."""
    time_limit: TimeLimitChange | None = None
    """A longer time limit (needs ``spec.timeLimitSeconds``): after ``time-limit``, so a job that
    did not finish in time gets more."""
    queue: KueueName | None = None
    """Another Kueue LocalQueue (needs ``spec.queue``: the job is Kueue's from its first submission)."""
    workload_priority_class: KueueName | None = None
    """Another Kueue WorkloadPriorityClass (needs ``spec.queue``)."""
    backend_model: ClassVar[type[OptionsModel]] = OptionsChange
    wire: ClassVar[tuple[str, str]] = ("change", "change")

    options: dict[str, SerializeAsAny[OptionsChange]] = Field(default_factory=dict)
    """Each backend's own changes, by backend name, each an instance of the change model its
    registry entry declares (``change.<backend>`` on the wire: Slurm's ``partition``)."""

    if TYPE_CHECKING:

        def __init__(
            self,
            *,
            memory: object = None,
            time_limit: object = None,
            queue: object = None,
            workload_priority_class: object = None,
            options: object = None,
            **backend_changes: OptionsChange,
        ) -> None: ...

    @model_validator(mode="after")
    def _names_something(self) -> Change:
        if not any(getattr(self, name) for name in type(self).model_fields):
            raise ValueError("a change names at least one field to change")
        for name, own in self.options.items():
            if not own.model_dump(exclude_none=True):
                raise ValueError(f"{name}: a change names at least one field to change")
        return self


class Rule(_Model):
    """``on`` these causes, take ``action``, at most ``budget`` times."""

    on: Annotated[tuple[CauseKind, ...], Field(min_length=1, max_length=len(RULE_CAUSES))]
    action: Action = Action.RESUBMIT
    budget: Annotated[int, Field(ge=0, le=MAX_BUDGET)]
    backoff: Backoff | None = None
    """The wait before each firing's new submission; none (the default): the next submission at once."""

    @field_validator("on")
    @classmethod
    def _causes(cls, on: tuple[CauseKind, ...]) -> tuple[CauseKind, ...]:
        if CauseKind.NONE in on:
            raise ValueError("'none' means success; a rule covers only causes of failure")
        if CauseKind.DEADLINE_EXCEEDED in on:
            raise ValueError(
                "'deadline-exceeded' ends the job for good: no rule can cover it (spec.deadlineSeconds)"
            )
        if len(set(on)) != len(on):
            raise ValueError("a cause is listed twice")
        return on

    exit_codes: ExitCodes | None = None
    """Only these exit codes of the training process: allowed on a rule whose ``on`` is exactly
    ``[non-zero-exit]``; rules whose codes are disjoint may then each cover ``non-zero-exit``."""
    change: Change | None = None
    """What each firing changes in the submission it authorizes (and, through it, in every later
    one): more memory, another Kueue queue or priority class, a backend's own fields. A rule with a
    change is the supervisor's (a scheduler's restart in place changes nothing)."""

    @field_validator("exit_codes")
    @classmethod
    def _codes_of_an_exit(cls, codes: ExitCodes | None, info: ValidationInfo) -> ExitCodes | None:
        # ``on`` is validated first (it is declared first): absent from ``info.data`` when refused.
        on = info.data.get("on")
        if codes is not None and on is not None and tuple(on) != (CauseKind.NON_ZERO_EXIT,):
            raise ValueError("allowed only on a rule whose on is exactly [non-zero-exit]")
        return codes

    def covers(self, cause: Cause) -> bool:
        """Whether this rule answers ``cause``: its kind is listed and, with ``exit_codes``, its code
        is among them."""
        if cause.kind not in self.on:
            return False
        return self.exit_codes is None or self.exit_codes.matches(cause.exit_code)


class RecoveryPolicy(_Model):
    """The rules. A cause may be covered by at most one rule, so which rule fires is never a question."""

    rules: Annotated[tuple[Rule, ...], Field(max_length=MAX_RULES)] = ()

    @model_validator(mode="after")
    def _one_rule_per_cause(self) -> RecoveryPolicy:
        owners: dict[CauseKind, list[int]] = {}
        for i, rule in enumerate(self.rules):
            for j, cause in enumerate(rule.on):
                for k in owners.get(cause, ()):
                    if not _disjoint(self.rules[k], rule):
                        both = rule.exit_codes is not None and self.rules[k].exit_codes is not None
                        codes = " (their exitCodes overlap)" if both else ""
                        raise ValueError(
                            f"rules[{i}].on[{j}]: cause '{cause}' is already covered by rules[{k}]{codes}"
                        )
                owners.setdefault(cause, []).append(i)
        return self

    def rule_for(self, cause: Cause) -> int | None:
        """The one rule that answers ``cause`` (its kind, and its exit code where rules name codes)."""
        for i, rule in enumerate(self.rules):
            if rule.covers(cause):
                return i
        return None


def _disjoint(a: Rule, b: Rule) -> bool:
    """Two rules on the same cause share none of it: both name exit codes, and no code is in both."""
    return a.exit_codes is not None and b.exit_codes is not None and not a.exit_codes.overlaps(b.exit_codes)


class Resources(_Model):
    """Per node. Strings are Kubernetes quantities."""

    cpu: Annotated[str, Field(max_length=32, pattern=r"^[0-9]+(\.[0-9]+)?m?$")] | None = None
    memory: MemoryQuantity | None = None
    gpu: Annotated[int, Field(ge=0, le=64)] = 0


ENV_NAME_PATTERN: Final = r"^[\x20-\x3c\x3e-\x7e]+$"
"""What Kubernetes accepts as an environment variable's name (printable ASCII without ``=``): a
PyTorchJob with another name is accepted but its pods are refused forever."""

EnvMap = Annotated[
    dict[
        Annotated[str, Field(min_length=1, max_length=256, pattern=ENV_NAME_PATTERN)],
        Annotated[str, Field(max_length=32768)],
    ],
    Field(max_length=128),
]


DEFAULT_GRACE_SECONDS: Final = 30
"""The kubelet's default ``terminationGracePeriodSeconds``: the grace a stop gives by default."""


class WarningSignal(StrEnum):
    """The signal a job asks for before its time limit (Slurm's ``--signal``)."""

    SIGTERM = "SIGTERM"
    SIGUSR1 = "SIGUSR1"
    SIGUSR2 = "SIGUSR2"
    SIGINT = "SIGINT"
    SIGHUP = "SIGHUP"

    @property
    def short(self) -> str:
        """Without ``SIG``, as Slurm's ``--signal`` writes it."""
        return self.value.removeprefix("SIG")


class StopPolicy(_Model):
    """How dispatch stops the program: SIGTERM, then SIGKILL once ``gracePeriodSeconds`` have passed
    (every stop: a cancel, an orphan, a time limit, the deadline); and a warning before the time
    limit, so that the program can write a checkpoint."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    grace_period_seconds: Annotated[int, Field(ge=0, le=86400)] = DEFAULT_GRACE_SECONDS
    """Seconds between SIGTERM and SIGKILL when dispatch or the scheduler stops the program (on
    Kubernetes the pods' ``terminationGracePeriodSeconds``, which a preemption or an eviction gives
    too). Default: the kubelet's 30."""
    warning_seconds: Annotated[int, Field(ge=1, le=MAX_LIMIT_SECONDS)] | None = None
    """Send ``warningSignal`` this many seconds before ``timeLimitSeconds`` (needs it): on Slurm the
    scheduler's ``--signal``; on Kubernetes dispatch begins the time limit's stop this early, with
    SIGTERM, and the program is killed at the limit."""
    warning_signal: WarningSignal = WarningSignal.SIGTERM
    """The warning's signal (Slurm sends it to the batch script; Kubernetes can send only SIGTERM)."""


class JobSpec(_ByBackend):
    """What to run and how to recover it. Fixed once submitted."""

    name: Annotated[str, Field(min_length=1, max_length=MAX_NAME_LENGTH, pattern=NAME_PATTERN)]
    command: Annotated[
        tuple[Annotated[str, Field(min_length=1, max_length=4096)], ...], Field(min_length=1, max_length=256)
    ]
    nodes: Annotated[int, Field(ge=1, le=MAX_NODES)] = 1
    recovery: RecoveryPolicy = RecoveryPolicy()
    queue: KueueName | None = None
    """The Kueue LocalQueue (in the job's namespace) that admits each submission: Kueue then decides
    when it starts and may preempt it; dispatch keeps the record, the rules and their budgets."""
    workload_priority_class: KueueName | None = None
    """Kueue's WorkloadPriorityClass for its submissions (its priority in Kueue's queueing and
    preemption); only with ``queue``."""
    time_limit_seconds: Annotated[int, Field(ge=1, le=MAX_LIMIT_SECONDS)] | None = None
    """How long each submission may run, from when it starts running: past it the submission is
    stopped with cause ``time-limit``, which a rule may cover like any other cause."""
    deadline_seconds: Annotated[int, Field(ge=1, le=MAX_LIMIT_SECONDS)] | None = None
    """How long the whole job may take, from its submission: every submission, wait and backoff
    counts. Past it the live submission is stopped, the job fails with cause ``deadline-exceeded``
    and nothing is resubmitted."""
    stop: StopPolicy = StopPolicy()
    """How a stop treats the program: its grace period, and a warning before the time limit."""
    options: dict[str, SerializeAsAny[OptionsModel]] = Field(default_factory=dict)
    """Each backend's options, by backend name, each an instance of the options model its registry
    entry declares (``spec.<backend>`` on the wire). Built by the API codec, which knows the models,
    or given as keywords (``JobSpec(..., kubeflow=KubeflowOptions(...))``); a plain mapping is
    refused here, since the core cannot tell which model it is."""
    ttl_seconds_after_settled: Annotated[int, Field(ge=0)] | None = None
    """Seconds after the job settles (its outcome recorded and every object it created ended) before
    the operator deletes it, as the Job controller's ``ttlSecondsAfterFinished`` does: counted from
    the settle the record keeps, so a restart changes nothing; 0 deletes it once settled. Unset:
    the operator's default (none unless its chart sets one), else kept until someone deletes it.
    May be changed at any time, also after the job settled."""

    if TYPE_CHECKING:
        # The signature a type checker sees: the fields (their values validated by pydantic, as the
        # generated signature leaves them) and any backend's options as a keyword. A field added to
        # JobSpec is added here too (mypy refuses it as a keyword until it is).
        def __init__(
            self,
            *,
            name: object,
            command: object,
            nodes: object = 1,
            recovery: object = None,
            queue: object = None,
            workload_priority_class: object = None,
            time_limit_seconds: object = None,
            deadline_seconds: object = None,
            stop: object = None,
            options: object = None,
            ttl_seconds_after_settled: object = None,
            **backend_options: OptionsModel,
        ) -> None: ...

    def gpus_per_node(self) -> int:
        """The GPUs each node holds, as the backend's options ask for them (0: none)."""
        return max((o.gpus_per_node() for o in self.options.values()), default=0)

    @model_validator(mode="after")
    def _priority_needs_queue(self) -> JobSpec:
        if self.workload_priority_class is not None and self.queue is None:
            raise ValueError("workloadPriorityClass is Kueue's and needs queue (a LocalQueue) as well")
        return self

    @model_validator(mode="after")
    def _warning_within_limit(self) -> JobSpec:
        warning = self.stop.warning_seconds
        if warning is not None:
            if self.time_limit_seconds is None:
                raise ValueError("stop.warningSeconds warns before timeLimitSeconds, which is not set")
            if warning >= self.time_limit_seconds:
                raise ValueError(
                    f"stop.warningSeconds ({warning}) must be less than timeLimitSeconds "
                    f"({self.time_limit_seconds})"
                )
        if self.stop.warning_signal is not WarningSignal.SIGTERM and warning is None:
            raise ValueError("stop.warningSignal is the warning's signal and needs stop.warningSeconds")
        return self


class NativeRule(_Model):
    """A kind of rule a scheduler enforces natively and exactly: these causes, no more, no fewer."""

    causes: frozenset[CauseKind]
    action: Action
    min_budget: int = 0
    max_budget: int = MAX_BUDGET
    note: str = ""
    backoff: str = "unknown"
    """The scheduler's own wait before each restart, in words, as its code has it."""

    def enforces(self, rule: Rule) -> bool:
        return (
            rule.action is self.action
            and rule.exit_codes is None
            and frozenset(rule.on) == self.causes
            and self.min_budget <= rule.budget <= self.max_budget
        )

    def describe(self) -> str:
        causes = " ".join(c.value for c in FAILURE_CAUSES if c in self.causes)
        budget = (
            f"budget {self.min_budget}"
            if self.min_budget == self.max_budget
            else f"budget {self.min_budget}..{self.max_budget}"
        )
        return f"{self.action} on exactly [{causes}] with {budget}"


class Capabilities(_Model):
    """What a backend's scheduler enforces by itself."""

    native: tuple[NativeRule, ...] = ()
    time_limit: str | None = None
    """How the scheduler itself ends each submission exactly at ``timeLimitSeconds``, in words
    (batch/v1 Job's ``activeDeadlineSeconds``); None: the supervisor stops it at the limit."""
    stop_grace: str | None = None
    """What decides a stop's grace period, in words, where it is not ``spec.stop.gracePeriodSeconds``
    (None: it is); then only the default grace is allowed."""
    warning_signal: bool = False
    """The scheduler sends a chosen signal a chosen time before the time limit (Slurm's
    ``--signal``); otherwise only SIGTERM, by dispatch's stop, can warn."""
    queues: bool = False
    """Kueue can queue its objects (its kind is one of Kueue's integrations, and the backend releases
    a queued object by Kueue's queue label instead of unsuspending it): ``spec.queue`` is allowed."""


def _is_zero(value: object) -> bool:
    """A count left out of a dump while zero: a record without a person's retry reads as before."""
    return value == 0


def _is_empty(value: object) -> bool:
    """A field left out of a dump while empty: a submission without changes reads as before them."""
    return value == ()


class FieldChange(_Model):
    """One field of the spec a submission runs with that differs from the previous submission's,
    by its path on the wire (``spec.job.resources.memory``): from, to."""

    field: Annotated[str, Field(max_length=256)]
    """The field's path on the wire (``spec.queue``, ``spec.slurm.partition``)."""
    from_: Annotated[str | None, Field(alias="from", max_length=1024)] = None
    """The previous submission's value; absent where it had none."""
    to: Annotated[str | None, Field(max_length=1024)] = None
    """This submission's value; absent where it has none."""

    def __str__(self) -> str:
        return f"{self.field} {self.from_ or '(none)'} -> {self.to or '(none)'}"


FieldChanges = Annotated[tuple[FieldChange, ...], Field(max_length=64, exclude_if=_is_empty)]


class PlannedRule(_Model):
    """One rule as planned: its enforcer, its budget and how often it has fired so far."""

    index: int
    on: tuple[CauseKind, ...]
    action: Action
    budget: int
    enforcer: Enforcer
    firings: int = 0
    exit_codes: ExitCodes | None = None
    """The rule's exit codes, when it covers only some codes of ``non-zero-exit``."""
    backoff: Annotated[Backoff | None, Field(exclude_if=_is_none)] = None
    """The rule's backoff, which the supervisor waits before each firing's new submission."""
    scheduler_backoff: Annotated[str | None, Field(exclude_if=_is_none)] = None
    """For a rule the scheduler enforces: the scheduler's own wait before each restart, in words."""
    change: Annotated[str | None, Field(exclude_if=_is_none)] = None
    """What each firing changes in the submission it authorizes, in words (the spec's rule has it
    exactly): ``memory x2 per firing, at most 64Gi; queue big``."""

    renewed: Annotated[int, Field(exclude_if=_is_zero)] = 0
    """The firings before a person's retry renewed the rule's budget: they no longer count against it."""

    @property
    def left(self) -> int:
        return max(self.budget - (self.firings - self.renewed), 0)


KUEUE_ENFORCES: Final = ("admission", "quota", "preemption")
DISPATCH_ENFORCES_WITH_KUEUE: Final = ("the rules' budgets", "recovery", "the record")


class QueuePlan(_Model):
    """Kueue's part of a queued job's plan: what Kueue decides, and what stays dispatch's."""

    queue: str
    """The LocalQueue each submission is released into."""
    workload_priority_class: str | None = None
    kueue: tuple[str, ...] = KUEUE_ENFORCES
    """Enforced by Kueue: when a submission starts (admission), how much runs (quota) and which
    running one it evicts for another (preemption)."""
    dispatch: tuple[str, ...] = DISPATCH_ENFORCES_WITH_KUEUE
    """Enforced by dispatch: an eviction is a cause like any other, answered by the job's rules within
    their budgets; Kueue's own requeue of an evicted object is stopped by ending that object."""


class LimitPlan(_Model):
    """Who enforces a time limit or the deadline, and how."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    seconds: int
    """The limit (``spec.timeLimitSeconds``) or the deadline (``spec.deadlineSeconds``)."""
    enforcer: Enforcer
    """The scheduler, where it ends each submission exactly at the limit by itself; else the supervisor."""
    how: str = ""
    """In words: the scheduler's own mechanism, or the supervisor's stop and when it begins."""


class Plan(_Model):
    """dispatch's answer before anything is created."""

    job: str
    rules: tuple[PlannedRule, ...] = ()
    uncovered: tuple[CauseKind, ...] = ()
    uncovered_exit_codes: ExitCodes | None = None
    """The exit codes of ``non-zero-exit`` no rule covers, when rules cover only some of them (then
    ``uncovered`` lists ``non-zero-exit`` too); absent when it is covered or uncovered as a whole."""
    queue: QueuePlan | None = None
    """Set when Kueue admits the job's submissions (``spec.queue``)."""
    time_limit: Annotated[LimitPlan | None, Field(exclude_if=_is_none)] = None
    """Set with ``spec.timeLimitSeconds``: who ends each submission at its limit."""
    deadline: Annotated[LimitPlan | None, Field(exclude_if=_is_none)] = None
    """Set with ``spec.deadlineSeconds``: always the supervisor, which ends the job at it."""


class ObjectView(_Model):
    """One scheduler object tagged (job, submission), as the scheduler shows it now."""

    id: str
    job: str
    submission: int
    phase: Phase
    cause: Cause | None = None
    """Why it ended; set when ``phase`` is ``ended``."""
    cancelled: bool = False
    """Ended because someone cancelled it: dispatch (ending an orphan or a cancelled job) or a person."""
    restarts: int = 0
    """In-place restarts the scheduler did under a scheduler-enforced rule."""
    terminating: bool = False
    """Ended, but some of its processes still run (a pod in its termination grace period): the job
    is not settled until they have stopped."""
    note: str = ""
    """What the scheduler shows of a live object that is not dispatch's doing (held on the
    scheduler by another controller, and by whom where that can be known): shown in status."""
    waiting: str = ""
    """Why a live object does not run yet, as its scheduler says (a pod no node can take, and when
    that becomes ``no-capacity``): shown in status, so a job that cannot start says why long
    before it ends."""
    stop: StopKind | None = None
    """How the program ended after a stop (dispatch's, or the scheduler's at its time limit),
    where the scheduler shows it: ``graceful`` (it exited within its grace period) or ``forced``
    (killed at its end); None when it was not stopped, or has not ended."""
    started_at: datetime | None = None
    """When the scheduler says the object's workload began running (the earliest running pod's
    start, Slurm's start time); None while it has not. A time limit counts from it."""
    retained: bool = False
    """Deleted on the scheduler by someone else, and kept there by dispatch (a Kubernetes finalizer)
    only until the record has what it shows: ``decide`` ends it (which lets it go) once the record no
    longer needs it. So a deletion made while no supervisor runs is read exactly as one seen live."""


class StopRequest(_Model):
    """A stop of a submission's canonical the supervisor began: why, by whom, when."""

    cause: Cause
    """What the submission's end is recorded as (``time-limit``, ``deadline-exceeded``)."""
    actor: Actor
    time: datetime


class Submission(_Model):
    """One authorization to run the job once, numbered 1, 2, 3...; recorded before its object exists."""

    n: Annotated[int, Field(ge=1)]
    authorized_at: datetime
    authorized_by: Actor
    rule: int | None = None
    """The rule whose firing authorized it; None for the first."""
    canonical: str | None = None
    cause: Cause | None = None
    """How its canonical object ended, once recorded."""
    restarts: int = 0
    ended_at: datetime | None = None
    """When ``cause`` was recorded: a rule's backoff counts from it."""
    stop: Annotated[StopRequest | None, Field(exclude_if=_is_none)] = None
    """The supervisor began to stop the canonical (its time limit, or the job's deadline): recorded
    before the stop, so that its end is read as this cause, not as a cancel."""
    started_at: datetime | None = None
    """When its canonical object began running, as the scheduler said:
    recorded in the write that records its end, so what it cost outlives the object."""
    changes: FieldChanges = ()
    """What the change of the rule whose firing authorized it made differ from the previous
    submission (:func:`dispatch.spec_for` computes the spec it runs with from the record alone)."""


class Transition(_Model):
    """One recorded change of state: from, to, the submission it concerns, cause, actor, time."""

    from_: State = Field(alias="from")
    to: State
    submission: Annotated[int, Field(ge=1)] | None = None
    """The submission it concerns; absent for a job cancelled before any submission was authorized."""
    cause: Cause
    actor: Actor
    time: datetime


class CancelRequest(_Model):
    """A person asked for the job to be cancelled: who and when (kept in the record)."""

    actor: Actor
    time: datetime


class SuspendRequest(_Model):
    """A person's latest word on suspending the job (kept in the record): ``suspend`` true stops the
    running submission and authorizes none; false resumes it with a new submission."""

    suspend: bool
    actor: Actor
    time: datetime


class RetryRequest(_Model):
    """A person asked for a failed job to run again (kept in the record): the ``n``-th retry."""

    n: Annotated[int, Field(ge=1)]
    """The retry's number: 1, 2, ... A request whose number the record has already taken
    (``Record.retries``) asks for nothing, so asking again with the same number is harmless."""
    actor: Actor
    time: datetime
    fresh_budget: int | None = None
    """A rule whose budget starts afresh with this retry (its earlier firings no longer count)."""


class Record(_Model):
    """The durable truth about one job. Every write of it is a compare-and-swap on its version."""

    job: str
    spec: JobSpec
    plan: Plan
    submitted_by: Actor
    submitted_at: datetime
    supervised: bool
    state: State = State.PENDING
    cause: Cause = NO_CAUSE
    submissions: tuple[Submission, ...] = ()
    history: tuple[Transition, ...] = ()
    cancel: CancelRequest | None = None
    suspend: SuspendRequest | None = None
    retry: RetryRequest | None = None
    retries: Annotated[int, Field(ge=0, exclude_if=_is_zero)] = 0
    """The number of the last retry taken: a retry request with a higher one is still to be taken."""
    settled: bool = False
    settled_at: datetime | None = None
    """When the job settled (written with ``settled``; cleared by a retry that reopens it): what a
    time to live after settling counts from."""

    @field_validator("state")
    @classmethod
    def _recorded(cls, state: State) -> State:
        if state in _SHOWN_ONLY:
            raise ValueError(f"'{state}' is never recorded; it exists only in status")
        return state

    @property
    def current(self) -> Submission | None:
        return self.submissions[-1] if self.submissions else None

    @property
    def retry_asked(self) -> RetryRequest | None:
        """A retry a person asked for that the record has not taken yet."""
        retry = self.retry
        return retry if retry is not None and retry.n > self.retries else None

    @property
    def suspend_asked(self) -> bool:
        """Whether a person's latest word is to keep the job suspended."""
        return self.suspend is not None and self.suspend.suspend


class SubmissionStatus(_Model):
    """One submission as status shows it: its canonical, how it ended and its live objects."""

    n: int
    canonical: str | None
    cause: Cause | None
    objects: tuple[ObjectView, ...] = ()
    changes: FieldChanges = ()
    """What its rule's change made differ from the previous submission."""


class CauseCost(_Model):
    """What recovering from one cause cost a job: its failures, the time to recover from them and
    the node- and GPU-seconds of the submissions they ended."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    cause: CauseKind
    failures: int = 0
    """Submissions whose canonical ended with this cause."""
    recovered: int = 0
    """Of those, the ones whose next submission has begun running."""
    recovery_seconds: float = 0.0
    """The sum, over the recovered ones, of the time from the failure's recorded end to the next
    submission running."""
    longest_recovery_seconds: float = 0.0
    """The longest of those times."""
    node_seconds: float = 0.0
    """Nodes times the time each failed submission ran (from running to its recorded end)."""
    gpu_seconds: float = 0.0
    """The node-seconds times the GPUs per node the job asks for."""


class Cost(_Model):
    """What recovery cost a job: totals over every failure, and per cause (at most one entry per
    cause, in the order of the causes, whatever the number of submissions)."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    failures: int = 0
    """Submissions whose canonical ended with a failure."""
    recovered: int = 0
    """Of those, the ones whose next submission has begun running."""
    recovery_seconds: float = 0.0
    """The sum of the times from a failure to the next submission running."""
    node_seconds: float = 0.0
    """The node-seconds of the submissions that failed."""
    gpu_seconds: float = 0.0
    """The GPU-seconds of the submissions that failed."""
    causes: Annotated[tuple[CauseCost, ...], Field(max_length=len(FAILURE_CAUSES))] = ()
    """The same, per cause that ended a submission."""


class Status(_Model):
    """What an observer sees: the record joined with the scheduler's live view."""

    job: str
    state: State
    cause: Cause
    plan: Plan
    submissions: tuple[SubmissionStatus, ...] = ()
    history: tuple[Transition, ...] = ()
    settled: bool = False
    message: str = ""
    cost: Cost = Cost()
    """What recovery has cost so far (see docs/semantics.md)."""


class SimulatedEnd(_Model):
    """One submission's end in a simulation and what the rules make of it."""

    submission: int
    cause: Cause
    rule: int | None = None
    """The rule that fired on it; None when none did (the job ended, or succeeded)."""
    backoff_seconds: float = 0.0
    """The wait before the next submission (the rule's backoff)."""
    next_submission: int | None = None
    """The submission the firing authorized; None when the job ended here."""
    budget_left: int | None = None
    """What the firing rule has left after this firing."""
    in_place: bool = False
    """The scheduler restarted the submission's object in place (a rule it enforces): no new
    submission, and the same submission ends again later."""
    change: str = ""
    """What the firing changes in the next submission; empty when it runs as the last one did."""
    state: State
    """The job's recorded state after this end: ``recovering``, or its outcome."""


class Simulation(_Model):
    """What :func:`simulate` answers: each end in order, where the job ends, and the causes unused."""

    ends: tuple[SimulatedEnd, ...]
    state: State
    """The job's outcome: ``succeeded`` once the causes are spent, or ``failed``."""
    cause: Cause
    unused: tuple[Cause, ...] = ()
    """Causes the job never met: it ended before them."""
    record: Record
    """The simulated record, its history and firings as a supervisor would have written them."""

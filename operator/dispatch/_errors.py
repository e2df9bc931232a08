"""The error hierarchy: every error dispatch raises on purpose is a :class:`DispatchError`.

Invalid input to the models (a :class:`~dispatch.JobSpec` with zero nodes, say) raises pydantic's
``ValidationError``, which is a ``ValueError`` whose message names the field; dispatch does not
wrap it, so the field path pydantic reports is the one users see.

::

    DispatchError
    ├── PlanError            a rule nobody can enforce, or a field the backend cannot honour
    ├── RecordError
    │   ├── JobNotFound
    │   ├── JobExists
    │   └── VersionConflict  a compare-and-swap lost: re-read and decide again
    ├── BackendError
    │   ├── TransientBackendError   worth retrying with backoff
    │   └── ObjectExists     a deterministic object name is taken (a second creator)
    ├── AdapterNotFound      (also a LookupError)
    ├── ConditionNotMet      Observer.wait: the job ended without reaching the condition
    ├── ConfigError          an adapter's configuration is invalid; names the key (also a ValueError)
    ├── OutsideLimits        beyond what the namespace's scheduler identity may use (also a ValueError)
    └── InvalidTransition    the memory scheduler cannot do that to this object now (also a ValueError)
"""

from __future__ import annotations


class DispatchError(Exception):
    """Base of every error dispatch raises deliberately."""


class PlanError(DispatchError):
    """A rule that neither the scheduler nor a supervisor can enforce, or a spec field the backend
    cannot honour (``field``, with ``rule`` None: ``spec.queue`` on a backend Kueue cannot queue):
    submission is refused."""

    def __init__(self, rule: int | None, reason: str, *, field: str | None = None) -> None:
        self.rule = rule
        self.reason = reason
        self.field = field
        where = f"rule {rule} cannot be enforced" if rule is not None else f"{field or 'spec'} is refused"
        super().__init__(f"{where}: {reason}")


class RecordError(DispatchError):
    """Something about a record in a record store."""


class JobNotFound(RecordError, KeyError):
    """The store has no record for the job."""

    def __init__(self, job: str) -> None:
        self.job = job
        super().__init__(f"no record for job {job!r}")

    def __str__(self) -> str:  # KeyError would quote the message again
        return str(self.args[0])


class JobExists(RecordError):
    """The store already has a record for the job: a job name is submitted once."""

    def __init__(self, job: str) -> None:
        self.job = job
        super().__init__(f"a record for job {job!r} already exists")


class VersionConflict(RecordError):
    """The record changed since it was read. The writer must re-read and decide again."""

    def __init__(self, job: str, expected: str, actual: str | None = None) -> None:
        self.job = job
        self.expected = expected
        self.actual = actual
        super().__init__(f"record of job {job!r} is no longer at version {expected}")


class BackendError(DispatchError):
    """A scheduler refused or failed a request."""


class TransientBackendError(BackendError):
    """A failure that may pass (timeout, 5xx, connection refused): retry with backoff."""


class ObjectExists(BackendError):
    """The object for (job, submission) already exists under its deterministic name."""

    def __init__(self, object_id: str) -> None:
        self.object_id = object_id
        super().__init__(f"object {object_id!r} already exists")


class AdapterNotFound(DispatchError, LookupError):
    """No adapter is registered under that name in the ``dispatch.adapters`` entry points."""

    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        super().__init__(f"no adapter named {name!r} in entry points dispatch.adapters (known: {known})")


class ConfigError(DispatchError, ValueError):
    """An adapter's configuration is invalid. The message names the adapter and the key.

    Also a ``ValueError``, so code written against a plain ``ValueError`` keeps catching it.
    """

    def __init__(self, message: str, *, key: str | None = None) -> None:
        self.key = key
        super().__init__(message)


class OutsideLimits(DispatchError, ValueError):
    """A job asks for what the scheduler identity of its namespace may not use (or its namespace has
    none). The message names the field."""


class InvalidTransition(DispatchError, ValueError):
    """That cannot be done now: to a memory scheduler's object (unknown id, or wrong phase), or to a
    job in its state (a retry of a job that has not failed, a suspend of one that has ended)."""


class ConditionNotMet(DispatchError):
    """:meth:`Observer.wait <dispatch.Observer.wait>`: the job ended and its status never met the
    condition; ``status`` is its last status, which will not change again."""

    def __init__(self, job: str, status: object) -> None:
        self.job = job
        self.status = status
        state = getattr(status, "state", "?")
        super().__init__(f"job {job!r} ended {state} without meeting the condition")

"""The DispatchJob codec: the one translation between a DispatchJob object (a dict) and the core's types.

Used by the record store, the admission webhook, the operator's runtime and the kubectl plugin, so
each reads a spec, a record, a refusal and the conditions exactly alike.

* **spec**: :func:`job_spec` turns ``.spec`` into the core's :class:`~dispatch.JobSpec` (``backend``
  and a person's asks, ``cancel``, ``suspend`` and ``retry``, are the DispatchJob's own; the name
  is ``metadata.name``). ``spec.backend`` must be a registered backend a DispatchJob may name;
  ``spec.<backend>`` holds that backend's options,
  validated with the options model its registry entry declares; options of another backend are
  refused (they would be ignored). Every problem is a :class:`SpecError` naming the field.
* **record**: the record is ``.status`` (:func:`record_from`, :func:`record_status`,
  :func:`new_record`), a cancel is ``spec.cancel``, a suspend ``spec.suspend`` and a retry
  ``spec.retry`` (:func:`with_asks`), each with the actor from an annotation.
* **conditions**: kstatus conditions computed from the record (:func:`conditions_for`), or from a
  refusal (:func:`refusal_conditions`, read back by :func:`refusal`):

  * ``Ready``: the summary, always present, reason always set: the state status shows
    (:data:`SHOWN_REASONS`: ``Running`` while the pods run, as ``kubectl get dj`` shows it), or
    why the job was refused. True only once the job has succeeded and settled.
  * ``Reconciling`` (present only while true): no outcome yet, or one but objects still ending.
  * ``Stalled`` (present only while true): no more progress without a person: failed, cancelled,
    or refused (a rule nobody can enforce, an invalid spec).
  * ``Succeeded`` / ``Failed``: the outcome; a cancelled job is ``Failed=True`` with reason
    ``Cancelled``. Both are present (False) while the job runs.

Pure: importing it loads no Kubernetes or HTTP client.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final, TypeVar

from pydantic import BaseModel, ValidationError

from . import _registry
from ._constants import (
    ANNOTATION_CANCELLED_BY,
    ANNOTATION_RETRIED_BY,
    ANNOTATION_SUBMITTED_BY,
    ANNOTATION_SUSPENDED_BY,
    COND_FAILED,
    COND_READY,
    COND_RECONCILING,
    COND_STALLED,
    COND_SUCCEEDED,
    KUEUE_LABEL_QUEUE,
    REASON_BACKEND_NOT_CONFIGURED,
    REASON_CANCELLED,
    REASON_FAILED,
    REASON_PENDING,
    REASON_RECOVERING,
    REASON_RUNNING,
    REASON_SUCCEEDED,
    REASON_SUSPENDED,
    STATUS_OBSERVED_CAUSE,
    STATUS_OBSERVED_NOTE,
    STATUS_OBSERVED_STATE,
)
from ._cost import recovery_cost
from ._errors import JobNotFound
from ._model import (
    RULE_CAUSES,
    Actor,
    ActorKind,
    CancelRequest,
    Cause,
    CauseKind,
    Cost,
    Enforcer,
    JobSpec,
    Plan,
    Record,
    RetryRequest,
    State,
    Submission,
    SuspendRequest,
    Transition,
    cause_words,
)

M = TypeVar("M", bound=BaseModel)


def job_id(namespace: str, name: str) -> str:
    """The job id of a DispatchJob: ``"<namespace>/<name>"``."""
    return f"{namespace}/{name}"


# ---- spec --------------------------------------------------------------------------------------------


class SpecError(ValueError):
    """A DispatchJob's spec the core cannot take: the message names each field (``spec.x.y: ...``)."""


def _where(loc: Sequence[object], prefix: str = "") -> str:
    """A field's path in one style: ``spec.kubeflow.resources.cpu``, a list item ``rules[0]``, a map's
    entry ``env[NAME]``. Pydantic's own steps (``[key]``, a validator's name) are left out."""
    parts = [prefix] if prefix else []
    for step in loc:
        if isinstance(step, int):
            parts[-1:] = [f"{parts[-1]}[{step}]"] if parts else [f"[{step}]"]
        elif isinstance(step, str) and not step.startswith(("[", "function-")):
            parts.append(step)
    path = ".".join(parts)
    if not prefix and path == "name":
        return "metadata.name"
    return f"spec.{path}" if path else "spec"


DNS_NAME_WORDS: Final = "lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"
PATTERN_WORDS: Final = {
    "cpu": "a CPU quantity, such as 2, 0.5 or 500m",
    "memory": "a memory quantity, such as 16Gi, 512Mi or 1G",
    "queue": DNS_NAME_WORDS,
    "workload_priority_class": DNS_NAME_WORDS,
    "name": "lowercase letters, digits and '-', starting and ending with a letter or digit",
}
"""What a field with a pattern takes, in words, by the field's name (a regex says it to nobody)."""
ENV_NAME_WORDS: Final = (
    "an environment variable's name is one or more printable ASCII characters (letters, digits, "
    "'_', '.', '-' and the like), without '='"
)


def _message(error: Mapping[str, Any]) -> str:
    """Pydantic's message without its ``Value error,`` prefix, a pattern said in words, and the
    causes a rule may name listed without ``none``."""
    msg = str(error["msg"])
    for lead in ("Value error, ", "Assertion failed, "):
        msg = msg.removeprefix(lead)
    loc = [str(step) for step in error["loc"]]
    if error["type"] == "string_pattern_mismatch":
        if "[key]" in loc and "env" in loc:
            return ENV_NAME_WORDS
        words = next((PATTERN_WORDS[step] for step in reversed(loc) if step in PATTERN_WORDS), None)
        if words is not None:
            return f"must be {words}, not {error.get('input')!r}"
    if error["type"] == "enum" and "on" in loc:
        causes = ", ".join(c.value for c in RULE_CAUSES)
        return f"{error.get('input')!r} is not a cause a rule can name: one of {causes}"
    return msg


def validation_message(error: ValidationError, prefix: str = "") -> str:
    """Pydantic's errors, each with the DispatchJob field it is about (``spec.kubeflow.image: ...``).

    A list's "too short" is left out where an item of it has its own error (the item says why)."""
    errors = error.errors()
    locs = [tuple(e["loc"]) for e in errors]
    shown = [
        e
        for e, loc in zip(errors, locs, strict=True)
        if not (e["type"] == "too_short" and any(o[: len(loc)] == loc and o != loc for o in locs))
    ]
    return "; ".join(f"{_where(e['loc'], prefix)}: {_message(e)}" for e in shown)


def backend_names() -> list[str]:
    """What ``spec.backend`` may say, sorted."""
    return [b.name for b in _registry.spec_backends()]


def backend_of(spec: Mapping[str, Any]) -> _registry.BackendInfo[Any]:
    """The registered backend ``spec.backend`` names; :class:`SpecError` when it names none."""
    name = spec.get("backend")
    info = _registry.get(name) if isinstance(name, str) else None
    if info is None or not info.in_spec:
        if name is None:
            raise SpecError(f"spec.backend is required: one of {backend_names()}")
        raise SpecError(f"spec.backend must be one of {backend_names()}, not {name!r}")
    return info


def options_problem(backend: _registry.BackendInfo[Any], spec: Mapping[str, Any]) -> str | None:
    """Options of a backend other than ``backend``, or none where ``backend`` requires them."""
    for name in _registry.option_fields():
        if name != backend.name and spec.get(name) is not None:
            return (
                f"spec.{name} is set but spec.backend is {backend.name}: options for {name} would be ignored"
            )
    if backend.options_required and spec.get(backend.name) is None:
        hint = f" ({backend.options_hint})" if backend.options_hint else ""
        return f"spec.{backend.name}{hint} is required when spec.backend is {backend.name}"
    return None


SPEC_ASKS: Final = ("cancel", "suspend", "retry")
"""A person's asks: the spec fields that may change after creation (the rest is fixed)."""
SPEC_MUTABLE: Final = (*SPEC_ASKS, "ttlSecondsAfterSettled")
"""The spec fields that may change after creation: a person's asks and how long the job is kept
once settled (as a Job's ``ttlSecondsAfterFinished`` may be changed)."""
SPEC_EXTRAS: Final = ("backend", *SPEC_ASKS)
"""Spec fields of the DispatchJob that are not fields of the core's JobSpec."""


def retry_count(spec: Mapping[str, Any]) -> int:
    """``spec.retry.count``: 0 when absent (or not a count: the CRD's schema refuses that)."""
    retry = spec.get("retry")
    count = retry.get("count") if isinstance(retry, Mapping) else None
    return count if isinstance(count, int) and not isinstance(count, bool) else 0


def fresh_budget(spec: Mapping[str, Any]) -> int | None:
    """``spec.retry.freshBudget``: the rule whose budget a retry renews, or None."""
    retry = spec.get("retry")
    rule = retry.get("freshBudget") if isinstance(retry, Mapping) else None
    return rule if isinstance(rule, int) and not isinstance(rule, bool) else None


def job_spec(body: Mapping[str, Any]) -> JobSpec:
    """The core's JobSpec of a DispatchJob: its spec without backend and a person's asks (cancel,
    suspend, retry), named metadata.name.

    Raises :class:`SpecError` naming the field when the spec is not valid (an unknown backend,
    another backend's options, an invalid value).
    """
    spec: Mapping[str, Any] = body.get("spec") or {}
    backend = backend_of(spec)
    labels = (body.get("metadata") or {}).get("labels") or {}
    if KUEUE_LABEL_QUEUE in labels:
        # Kueue's convention on the objects it queues, not on a DispatchJob: dispatch writes it on
        # each submission's object itself, and only once the record names that object canonical.
        raise SpecError(
            f"metadata.labels[{KUEUE_LABEL_QUEUE}]: dispatch does not read Kueue's label on a "
            f"DispatchJob; name the LocalQueue in spec.queue (queue: {labels[KUEUE_LABEL_QUEUE]})"
        )
    problem = options_problem(backend, spec)
    if problem is not None:
        raise SpecError(problem)
    fields = {k: v for k, v in spec.items() if k not in SPEC_EXTRAS}
    options: dict[str, Any] = {}
    problems: list[str] = []
    if "options" in fields:  # the core's field, never the wire's: options are spec.<backend>
        problems.append(
            "spec.options: Extra inputs are not permitted (a backend's options are spec.<backend>)"
        )
        del fields["options"]
    if backend.options is not None and backend.name in fields:
        try:
            options[backend.name] = backend.options.model_validate(fields.pop(backend.name))
        except ValidationError as error:
            problems.append(validation_message(error, backend.name))
    fields = _with_built_changes(backend, fields, problems)
    try:
        result = JobSpec.model_validate({**fields, "options": options, "name": body["metadata"]["name"]})
    except ValidationError as error:
        problems.insert(0, validation_message(error))
    if problems:
        raise SpecError("; ".join(problems))
    return result


def _with_built_changes(
    backend: _registry.BackendInfo[Any], fields: dict[str, Any], problems: list[str]
) -> dict[str, Any]:
    """``fields`` with each rule's ``change.<backend>`` built with the change model ``backend``
    declares (into the core's ``change.options``); a change of another backend, or of one that
    declares none, is a problem naming the field: ``backend`` cannot make it."""
    recovery = fields.get("recovery")
    rules = recovery.get("rules") if isinstance(recovery, Mapping) else None
    if not isinstance(recovery, Mapping) or not isinstance(rules, list):
        return fields
    built: list[Any] = []
    for i, rule in enumerate(rules):
        change = rule.get("change") if isinstance(rule, Mapping) else None
        if not isinstance(rule, Mapping) or not isinstance(change, Mapping):
            built.append(rule)
            continue
        where = f"recovery.rules[{i}].change"
        own: dict[str, Any] = {}
        rest = dict(change)
        if "options" in rest:  # the core's field, never the wire's
            problems.append(f"spec.{where}.options: Extra inputs are not permitted (change.<backend>)")
            del rest["options"]
        refused = False
        for name in backend_names():
            if name not in rest:
                continue
            value = rest.pop(name)
            if name != backend.name or backend.change is None:
                refused = True
                has = "has no change of its own" if name == backend.name else f"is not {name}"
                problems.append(
                    f"spec.{where}.{name}: backend {backend.name} {has}: it cannot make this change"
                )
                continue
            try:
                own[name] = backend.change.model_validate(value)
            except ValidationError as error:
                problems.append(validation_message(error, f"{where}.{name}"))
        if refused and not rest and not own:  # said once: not "names no field" as well
            built.append({k: v for k, v in rule.items() if k != "change"})
            continue
        built.append({**rule, "change": {**rest, "options": own}})
    return {**fields, "recovery": {**recovery, "rules": built}}


def spec_options(spec: JobSpec) -> dict[str, Any]:
    """The inverse of :func:`job_spec` for the options: ``spec.<backend>`` fields as the wire has them."""
    return {
        name: value.model_dump(mode="json", by_alias=True, exclude_none=True)
        for name, value in spec.options.items()
    }


# ---- record ------------------------------------------------------------------------------------------


def utcnow() -> datetime:
    return datetime.now(UTC)


UNKNOWN_HUMAN: Final = Actor(kind=ActorKind.HUMAN, id="unknown")
RECORD_FIELDS: Final = tuple(
    info.alias or name for name, info in Record.model_fields.items() if name not in ("job", "spec")
)


REQUESTERS: Final = frozenset({ActorKind.HUMAN, ActorKind.SERVICE_ACCOUNT})
"""The kinds of actor that ask for a job or its cancel through the API: only the supervisor and
the scheduler act as themselves, and only in the record."""


def parse_actor(text: str | None, default: Actor = UNKNOWN_HUMAN) -> Actor:
    """A requester's annotation: ``"kind:id"`` (kind one of :data:`REQUESTERS`) or a bare name (a
    human). An annotation claiming the supervisor or the scheduler was written by hand, where no
    webhook stamped it: it is ``default``, since the record must not say dispatch did it."""
    if not text:
        return default
    kind, sep, ident = text.partition(":")
    if sep and kind in {k.value for k in ActorKind} and ident:
        return Actor(kind=ActorKind(kind), id=ident) if ActorKind(kind) in REQUESTERS else default
    return Actor(kind=ActorKind.HUMAN, id=text)


def _annotations(body: Mapping[str, Any]) -> Mapping[str, str]:
    return body.get("metadata", {}).get("annotations") or {}


def _time(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def submitted_by(body: Mapping[str, Any]) -> Actor:
    return parse_actor(_annotations(body).get(ANNOTATION_SUBMITTED_BY))


def submitted_at(body: Mapping[str, Any]) -> datetime:
    return _time(body.get("metadata", {}).get("creationTimestamp")) or utcnow()


def cancel_time(body: Mapping[str, Any], clock: Callable[[], datetime]) -> datetime:
    """When spec.cancel was set: the latest managedFields entry that owns it, else now."""
    latest: datetime | None = None
    for entry in body.get("metadata", {}).get("managedFields") or ():
        fields = (entry.get("fieldsV1") or {}).get("f:spec") or {}
        if "f:cancel" in fields:
            when = _time(entry.get("time"))
            if when is not None and (latest is None or when > latest):
                latest = when
    return latest or clock()


def has_record(body: Mapping[str, Any]) -> bool:
    return "plan" in (body.get("status") or {})


def record_from(body: Mapping[str, Any], *, clock: Callable[[], datetime] = utcnow) -> Record:
    """The record a DispatchJob holds (spec + status); raises JobNotFound when it holds none yet."""
    meta = body["metadata"]
    job = job_id(meta["namespace"], meta["name"])
    status = body.get("status") or {}
    if "plan" not in status:
        raise JobNotFound(job)
    data = {k: status[k] for k in RECORD_FIELDS if k in status}
    record = Record.model_validate({**data, "job": job, "spec": job_spec(body)})
    if record.cancel is None and (body.get("spec") or {}).get("cancel"):
        actor = parse_actor(_annotations(body).get(ANNOTATION_CANCELLED_BY))
        record = record.model_copy(
            update={"cancel": CancelRequest(actor=actor, time=cancel_time(body, clock))}
        )
    return with_asks(record, body, clock)


def with_asks(record: Record, body: Mapping[str, Any], clock: Callable[[], datetime] = utcnow) -> Record:
    """``record`` with the suspend and retry a person asked for in the spec and the record does not
    hold yet, each with its actor from the annotation the admission webhook stamps.

    ``spec.suspend`` is the person's latest word (true: keep the job suspended; false: resume it);
    ``spec.retry.count`` asks for one retry each time it is raised above the last one the record
    took (``Record.retries``), so applying the same manifest again asks for nothing."""
    spec: Mapping[str, Any] = body.get("spec") or {}
    notes = _annotations(body)
    update: dict[str, object] = {}
    suspend = bool(spec.get("suspend"))
    if suspend != record.suspend_asked:
        actor = parse_actor(notes.get(ANNOTATION_SUSPENDED_BY))
        update["suspend"] = SuspendRequest(suspend=suspend, actor=actor, time=clock())
    count = retry_count(spec)
    if count > record.retries and (record.retry is None or record.retry.n != count):
        actor = parse_actor(notes.get(ANNOTATION_RETRIED_BY))
        update["retry"] = RetryRequest(n=count, actor=actor, time=clock(), fresh_budget=fresh_budget(spec))
    return record.model_copy(update=update) if update else record


def record_status(record: Record) -> dict[str, Any]:
    """The record as the status holds it (camelCase, no nulls, without job and spec)."""
    data: dict[str, Any] = record.model_dump(
        mode="json", by_alias=True, exclude_none=True, exclude={"job", "spec"}
    )
    return data


def new_record(body: Mapping[str, Any], spec: JobSpec, plan: Plan) -> Record:
    """The first record of a DispatchJob: planned, supervised, nothing authorized yet."""
    meta = body["metadata"]
    record = Record(
        job=job_id(meta["namespace"], meta["name"]),
        spec=spec,
        plan=plan,
        submitted_by=submitted_by(body),
        submitted_at=submitted_at(body),
        supervised=True,
        # A manifest applied again with the count it had asks for no retry of the new job.
        retries=retry_count(body.get("spec") or {}),
    )
    return with_asks(record, body)


# ---- conditions ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Condition:
    type: str
    status: bool
    reason: str
    message: str


def cause_text(kind: str, detail: object = "", exit_code: object = None, signal: object = None) -> str:
    """``kind exit code N signal S: detail``, the kind said once: a detail that already starts with
    it (a scheduler's "preempted by a higher-priority job") is shown as it is."""
    said = cause_words(kind, exit_code, signal)
    words = " ".join(str(detail or "").split())
    if not words:
        return said
    return words if words.startswith(kind) and said == kind else f"{said}: {words}"


def _outcome_message(record: Record) -> str:
    cause = record.cause
    what = cause_text(cause.kind.value, cause.detail, cause.exit_code, cause.signal)
    if record.state is State.SUCCEEDED:
        return f"succeeded in submission {len(record.submissions)}"
    if record.state is State.CANCELLED:
        return f"cancelled by {record.cancel.actor}" if record.cancel else f"cancelled: {cause.detail}"
    index = record.spec.recovery.rule_for(cause)
    if index is None:
        if cause.kind in record.plan.uncovered:
            return f"failed: cause {what} is not covered by any rule"
        return f"failed: cause {what}"
    rule = record.plan.rules[index]
    if rule.left == 0 and rule.enforcer is Enforcer.SUPERVISOR:
        spent = rule.firings - rule.renewed  # since a person's retry last renewed it
        return f"failed: cause {what}; rule {index} has used its budget ({spent}/{rule.budget})"
    return f"failed: cause {what} (rule {index}, enforced by the {rule.enforcer})"


# ---- a settled job's time to live and its final record ------------------------------------------


def settled_time(record: Record) -> datetime | None:
    """When ``record`` settled; None while it has not. A record written before the settle time was
    kept counts from its outcome's transition, the write just before the settle."""
    if not record.settled:
        return None
    if record.settled_at is not None:
        return record.settled_at
    return record.history[-1].time if record.history else record.submitted_at


def expires_at(record: Record, ttl_seconds: int | None) -> datetime | None:
    """When a job kept ``ttl_seconds`` after it settled is to be deleted; None while it has not
    settled, or when it is kept (no time to live)."""
    settled = settled_time(record)
    if settled is None or ttl_seconds is None:
        return None
    return settled + timedelta(seconds=ttl_seconds)


def final_summary(record: Record) -> dict[str, Any]:
    """The final record in brief (JSON): what the job was, how it ended and what recovery cost, for
    the Event and the log line a time to live's deletion leaves behind."""
    cause = record.cause
    cost = recovery_cost(record)
    settled = settled_time(record)
    summary: dict[str, Any] = {
        "job": record.job,
        "state": record.state.value,
        "cause": cause_text(cause.kind.value, cause.detail, cause.exit_code, cause.signal),
        "message": _outcome_message(record),
        "submissions": len(record.submissions),
        "submittedBy": str(record.submitted_by),
        "submittedAt": _stamp(record.submitted_at),
        "settledAt": _stamp(settled) if settled is not None else None,
        "failures": cost.failures,
        "recoverySeconds": round(cost.recovery_seconds, 3),
        "gpuSeconds": round(cost.gpu_seconds, 3),
    }
    return {k: v for k, v in summary.items() if v is not None}


def expired_note(summary: Mapping[str, Any]) -> str:
    """The Event's note of a job deleted once its time to live passed."""
    return (
        f"deleted once its time to live after settling passed: {summary['message']} "
        f"(submitted {summary['submittedAt']} by {summary['submittedBy']}, settled "
        f"{summary.get('settledAt', 'at an unknown time')}, {summary['submissions']} submission(s), "
        f"{summary['failures']} failure(s))"
    )


def _stamp(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


REASON_CANCELLING: Final = "Cancelling"
SHOWN_REASONS: Final = {
    State.PENDING: REASON_PENDING,
    State.RUNNING: REASON_RUNNING,
    State.RECOVERING: REASON_RECOVERING,
    State.SUSPENDED: REASON_SUSPENDED,
    State.CANCELLING: REASON_CANCELLING,
    State.SUCCEEDED: REASON_SUCCEEDED,
    State.FAILED: REASON_FAILED,
    State.CANCELLED: REASON_CANCELLED,
}
"""The Ready reason of each state status shows: the condition says the state the STATE column says."""


def shown_state(record: Record, observed: Mapping[str, str]) -> State:
    """The state status shows for ``record`` with the observed fields ``observed``: the observed
    state, unless it names an outcome the record does not hold yet (the record is the truth)."""
    try:
        shown = State(observed.get(STATUS_OBSERVED_STATE, ""))
    except ValueError:
        return record.state
    if shown.is_outcome and shown is not record.state:
        return record.state
    return shown


def _running_message(record: Record, shown: State) -> str:
    n = len(record.submissions)
    if shown is State.CANCELLING:
        return "cancel requested; ending the job's objects"
    if shown is State.SUSPENDED:
        return "suspend requested; stopping the running submission"
    if not n:
        return "planned; no submission authorized yet"
    after = f" (recovered from {record.cause.kind.value})" if record.state is State.RECOVERING else ""
    if shown is State.RUNNING:
        return f"submission {n} running{after}"
    if shown is State.RECOVERING or record.state is State.RECOVERING:
        return f"recovering from {record.cause.kind.value}: submission {n} authorized"
    return f"submission {n} authorized"


def conditions_for(record: Record, shown: State | None = None, note: str = "") -> list[Condition]:
    """The kstatus conditions of a record (see the module docstring) while status shows ``shown``
    (:func:`shown_state`; the record's state when not given) and ``note``: the reason of ``Ready``
    and ``Reconciling`` is always the shown state's (:data:`SHOWN_REASONS`), so ``kubectl get dj``,
    the plugin and a GitOps tool reading the conditions say one state; until an outcome, the
    message ends with the note (why the current object does not run), which Argo CD shows."""
    state = record.state
    shown = state if shown is None else shown
    if state is State.SUSPENDED and shown is State.SUSPENDED:
        # Paused by a person, not progressing and not stuck: neither Reconciling nor Stalled.
        message = f"{record.cause.detail}; set spec.suspend to false to resume with a new submission"
        return [
            Condition(COND_READY, False, REASON_SUSPENDED, message),
            Condition(COND_SUCCEEDED, False, REASON_SUSPENDED, message),
            Condition(COND_FAILED, False, REASON_SUSPENDED, message),
        ]
    if not state.is_outcome:
        reason, message = SHOWN_REASONS[shown], _running_message(record, shown)
        if note:
            message = f"{message}; {note}"
        return [
            Condition(COND_READY, False, reason, message),
            Condition(COND_RECONCILING, True, reason, message),
            Condition(COND_SUCCEEDED, False, reason, message),
            Condition(COND_FAILED, False, reason, message),
        ]
    message = _outcome_message(record)
    reason = SHOWN_REASONS[state]
    now = SHOWN_REASONS[shown] if shown is State.CANCELLING and not record.settled else reason
    out = [
        Condition(COND_READY, state is State.SUCCEEDED and record.settled, now, message),
        Condition(COND_SUCCEEDED, state is State.SUCCEEDED, reason, message),
        Condition(COND_FAILED, state is not State.SUCCEEDED, reason, message),
    ]
    if not record.settled:
        out.append(Condition(COND_RECONCILING, True, now, f"{message}; ending the job's objects"))
    elif state is not State.SUCCEEDED:
        out.append(Condition(COND_STALLED, True, reason, message))
    return out


WAITING_REASONS: Final = frozenset({REASON_BACKEND_NOT_CONFIGURED})
"""Why a job that has no record yet waits rather than is refused: what it needs may come."""


def refusal_conditions(reason: str, message: str) -> list[Condition]:
    """A job dispatch refuses (nothing will be created): not ready, stalled, failed. A job that
    waits for something that may come (:data:`WAITING_REASONS`: an operator with its backend) is
    not ready and reconciling, neither stalled nor failed, so GitOps tools and ``kubectl wait``
    read it as in progress."""
    if reason in WAITING_REASONS:
        return [
            Condition(COND_READY, False, reason, message),
            Condition(COND_RECONCILING, True, reason, message),
            Condition(COND_SUCCEEDED, False, reason, message),
            Condition(COND_FAILED, False, reason, message),
        ]
    return [
        Condition(COND_READY, False, reason, message),
        Condition(COND_STALLED, True, reason, message),
        Condition(COND_SUCCEEDED, False, reason, message),
        Condition(COND_FAILED, True, reason, message),
    ]


def render_conditions(
    conditions: Iterable[Condition], previous: Sequence[Mapping[str, Any]], generation: int, now: datetime
) -> list[dict[str, Any]]:
    """metav1.Conditions, keeping lastTransitionTime where the status did not change."""
    before = {c.get("type"): c for c in previous}
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    out = []
    for c in conditions:
        status = "True" if c.status else "False"
        old = before.get(c.type)
        changed = old is None or old.get("status") != status
        out.append(
            {
                "type": c.type,
                "status": status,
                "observedGeneration": generation,
                "lastTransitionTime": stamp if changed else old["lastTransitionTime"],  # type: ignore[index]
                "reason": c.reason,
                "message": c.message[:32768],
            }
        )
    return out


OBSERVED_FIELDS: Final = (STATUS_OBSERVED_STATE, STATUS_OBSERVED_CAUSE, STATUS_OBSERVED_NOTE)


def observed_fields(state: State, cause: Cause, note: str = "") -> dict[str, str]:
    """The observed status fields for what an observer sees now (no cause, no note: that field is
    absent)."""
    fields = {STATUS_OBSERVED_STATE: str(state)}
    if cause.kind is not CauseKind.NONE:
        fields[STATUS_OBSERVED_CAUSE] = str(cause.kind)
    if note:
        fields[STATUS_OBSERVED_NOTE] = note[:1024]
    return fields


def observed_of(body: Mapping[str, Any]) -> dict[str, str]:
    status = body.get("status") or {}
    return {k: str(status[k]) for k in OBSERVED_FIELDS if k in status}


def refusal(body: Mapping[str, Any]) -> str | None:
    """The reason the current generation was refused or waits (a status without a record, with
    Stalled=True, or Reconciling=True for one of :data:`WAITING_REASONS`), if so."""
    status = body.get("status") or {}
    if "plan" in status:
        return None
    generation = int(body.get("metadata", {}).get("generation") or 0)
    if status.get("observedGeneration") != generation:
        return None
    for c in status.get("conditions") or ():
        if c.get("status") != "True":
            continue
        if c.get("type") == COND_STALLED or (
            c.get("type") == COND_RECONCILING and c.get("reason") in WAITING_REASONS
        ):
            return str(c.get("reason"))
    return None


@dataclass(frozen=True, slots=True)
class StatusRead:
    """What a DispatchJob's status says, read in one pass (the record store's projection of a version)."""

    recorded: bool
    """The status holds a record (:func:`has_record`)."""
    refusal: str | None
    """Why this generation was refused (:func:`refusal`), if it was."""
    observed: dict[str, str]
    """The observed fields (:func:`observed_of`)."""
    cancelled_at: datetime | None
    """When ``spec.cancel`` was set, while the record holds no cancel yet (:func:`cancel_time`)."""
    settled_at: datetime | None = None
    """When the job settled, while it stays settled: None while it has not, and for a failed job
    whose retry a person asked for and the record has not taken (it reopens): :func:`settled_status`."""


def read_status(body: Mapping[str, Any], clock: Callable[[], datetime] = utcnow) -> StatusRead:
    """:func:`has_record`, :func:`refusal`, :func:`observed_of`, the cancel time and the settle time
    (:func:`settled_status`) of one body."""
    recorded = has_record(body)
    cancelled_at: datetime | None = None
    if recorded and (body.get("spec") or {}).get("cancel") and "cancel" not in (body.get("status") or {}):
        cancelled_at = cancel_time(body, clock)
    settled_at = settled_status(body) if recorded else None
    return StatusRead(recorded, refusal(body), observed_of(body), cancelled_at, settled_at)


def settled_status(body: Mapping[str, Any]) -> datetime | None:
    """When the record in ``body`` settled (:func:`settled_time`, read from the status without
    parsing the record), or None: not settled, or a failed job a person's retry reopens
    (:func:`~dispatch._decide.reopening`: a retry asked in the spec or the record and not yet taken)."""
    status = body.get("status") or {}
    if not status.get("settled"):
        return None
    if status.get("state") == State.FAILED.value:
        asked = max(retry_count(body.get("spec") or {}), int((status.get("retry") or {}).get("n") or 0))
        if asked > int(status.get("retries") or 0):
            return None
    history = status.get("history") or ()
    last = history[-1].get("time") if history and isinstance(history[-1], Mapping) else None
    return _time(status.get("settledAt") or last) or submitted_at(body)


def ttl_of(spec: Mapping[str, Any]) -> int | None:
    """``spec.ttlSecondsAfterSettled`` of a DispatchJob's spec, None when unset."""
    ttl = spec.get("ttlSecondsAfterSettled")
    return None if ttl is None else int(ttl)


def _shown_conditions(
    record: Record,
    observed: Mapping[str, str],
    previous: Sequence[Mapping[str, Any]],
    generation: int,
    now: datetime,
) -> list[dict[str, Any]]:
    """The conditions of ``record`` while status shows ``observed`` (its state and note)."""
    shown = shown_state(record, observed)
    return render_conditions(
        conditions_for(record, shown, observed.get(STATUS_OBSERVED_NOTE, "")), previous, generation, now
    )


STATUS_COST: Final = "cost"
"""The status field of what recovery cost (:class:`~dispatch.Cost`), absent until a failure."""


def cost_status(cost: Cost) -> dict[str, Any] | None:
    """``cost`` as the status holds it (camelCase, per cause), None while there is none."""
    if not cost.failures:
        return None
    data: dict[str, Any] = cost.model_dump(mode="json", by_alias=True)
    return data


def _with_cost(status: dict[str, Any], cost: Cost) -> dict[str, Any]:
    shown = cost_status(cost)
    if shown is None:
        status.pop(STATUS_COST, None)
    else:
        status[STATUS_COST] = shown
    return status


def record_write(
    record: Record,
    *,
    previous: Sequence[Mapping[str, Any]],
    generation: int,
    now: datetime,
    observed: Mapping[str, str],
    cost: Cost | None = None,
) -> dict[str, Any]:
    """The status a write of ``record`` puts: the record (:func:`record_status`), the generation it
    observed, its conditions (``previous``: the conditions written before, whose transition times
    stay), the observed fields: ``observed``, or those of its outcome once it settles (nothing
    changes after that, so an observer would only write them again), and what recovery cost:
    ``cost`` (computed with the live objects), else what the record alone says."""
    shows = observed_fields(record.state, record.cause) if record.settled else observed
    status = record_status(record)
    status["observedGeneration"] = generation
    status["conditions"] = _shown_conditions(record, shows, previous, generation, now)
    status.update(shows)
    return _with_cost(status, cost if cost is not None else recovery_cost(record))


def observe_write(
    record: Record,
    status: Mapping[str, Any],
    observed: Mapping[str, str],
    *,
    previous: Sequence[Mapping[str, Any]],
    generation: int,
    now: datetime,
    cost: Cost | None = None,
) -> dict[str, Any]:
    """The status a write of the observed fields alone puts: ``status`` (without the observed
    fields) with ``observed`` and the conditions of ``record`` as they now show
    (:func:`conditions_for` with :func:`shown_state`), so the conditions never say another state;
    and ``cost`` when given (a submission that began running ends a recovery)."""
    out = {k: v for k, v in status.items() if k not in OBSERVED_FIELDS}
    out["conditions"] = _shown_conditions(record, observed, previous, generation, now)
    out.update(observed)
    return out if cost is None else _with_cost(out, cost)


def refusal_write(
    reason: str, message: str, *, previous: Sequence[Mapping[str, Any]], generation: int, now: datetime
) -> dict[str, Any]:
    """The status of a refused job (no record): :func:`refusal_conditions` at ``generation``."""
    return {
        "observedGeneration": generation,
        "conditions": render_conditions(refusal_conditions(reason, message), previous, generation, now),
    }


# ---- a status as it is (leniently, for display: a field a reader cannot decode is left out) -------


def status_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    status = obj.get("status")
    return status if isinstance(status, Mapping) else {}


def condition(obj: Mapping[str, Any], kind: str = COND_READY) -> Mapping[str, Any] | None:
    for cond in status_of(obj).get("conditions") or ():
        if isinstance(cond, Mapping) and cond.get("type") == kind:
            return cond
    return None


def _each(model: type[M], items: object) -> list[M]:
    """Each item ``model`` can decode, in order; the others are left out."""
    found = []
    for item in items if isinstance(items, list | tuple) else ():
        try:
            found.append(model.model_validate(item))
        except ValidationError:
            continue
    return found


def transitions(obj: Mapping[str, Any]) -> list[Transition]:
    return _each(Transition, status_of(obj).get("history"))


def submissions(obj: Mapping[str, Any]) -> list[Submission]:
    return _each(Submission, status_of(obj).get("submissions"))


def _one(model: type[M], raw: object) -> M | None:
    """``raw`` as ``model``, or None when it is not one."""
    if not isinstance(raw, Mapping):
        return None
    try:
        return model.model_validate(raw)
    except ValidationError:
        return None


def cost_of(obj: Mapping[str, Any]) -> Cost | None:
    """What recovery cost, as the status says (None: no failure yet, or unreadable)."""
    return _one(Cost, status_of(obj).get(STATUS_COST))


def plan_of(obj: Mapping[str, Any]) -> Plan | None:
    return _one(Plan, status_of(obj).get("plan"))

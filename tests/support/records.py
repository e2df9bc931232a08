"""The seed job's records in every state the operator writes, and the DispatchJob the API server
serves for each: what the health checks and the record store's cache are tested on.

The records are moved through the protocol by :func:`dispatch._decide.apply` (as the supervisor
moves them) and turned into ``.status`` by the operator's own code, so a test of a status reads
what the operator really writes.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

from dispatch import (
    Actor,
    ActorKind,
    Capabilities,
    Cause,
    CauseKind,
    JobSpec,
    Record,
    RecoveryPolicy,
    Rule,
    State,
)
from dispatch._backends.kubeflow._adapter import CAPABILITIES
from dispatch._constants import FINALIZER
from dispatch._decide import (
    Authorize,
    RecordCanonical,
    RecordOutcome,
    RecordSettled,
    RecordSuspend,
    Write,
    apply,
    decide,
)
from dispatch._dispatchjob import conditions_for, record_status, refusal_conditions, render_conditions
from dispatch._model import SUPERVISOR, CancelRequest
from dispatch._plan import make_plan
from tests.support import builders

T0 = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
ADA = Actor(kind=ActorKind.HUMAN, id="ada")
PREEMPTED = Cause(kind=CauseKind.PREEMPTED, detail="preempted by a higher-priority job")
OOM = Cause(kind=CauseKind.OUT_OF_MEMORY, exit_code=137)
SUCCESS = Cause(kind=CauseKind.NONE)
NOTHING_NATIVE = Capabilities()
"""A backend that enforces no rule itself: every rule is the supervisor's."""
PREEMPT_TWICE = Rule(on=(CauseKind.PREEMPTED,), budget=2)


def new_record(
    *rules: Rule, capabilities: Capabilities = NOTHING_NATIVE, supervised: bool = True, name: str = "job"
) -> Record:
    """A job with ``rules`` as the protocol tests submit it, planned for ``capabilities``."""
    spec = JobSpec(name=name, command=("train",), recovery=RecoveryPolicy(rules=rules))
    return Record(
        job=name,
        spec=spec,
        plan=make_plan(name, spec, capabilities, supervised=supervised),
        submitted_by=ADA,
        submitted_at=T0,
        supervised=supervised,
    )


def started(*rules: Rule, capabilities: Capabilities = NOTHING_NATIVE) -> Record:
    """Submission 1 authorized, object "1" recorded canonical."""
    return step(new_record(*rules, capabilities=capabilities), Authorize(1), RecordCanonical(1, "1"))


def seed_record() -> Record:
    """``team-a/finetune`` as submitted: resubmit twice after a preemption, nothing authorized."""
    spec = JobSpec(
        name="finetune",
        command=("torchrun", "train.py"),
        recovery=RecoveryPolicy(rules=(Rule(on=(CauseKind.PREEMPTED,), budget=2),)),
    )
    return Record(
        job="team-a/finetune",
        spec=spec,
        plan=make_plan("finetune", spec, CAPABILITIES, supervised=True),
        submitted_by=ADA,
        submitted_at=T0,
        supervised=True,
    )


def step(record: Record, *writes: Write, actor: Actor = SUPERVISOR) -> Record:
    """``record`` after ``writes``, one second apart."""
    for i, w in enumerate(writes):
        record = apply(record, w, actor=actor, now=T0 + timedelta(seconds=i))
    return record


def dispatch_job(
    record: Record | None,
    *,
    generation: int = 1,
    observed: int | None = None,
    refused: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """The DispatchJob as the API server serves it after KubeRecordStore wrote ``record``."""
    observed = generation if observed is None else observed
    body = builders.dispatch_job("finetune", namespace="team-a", command=["torchrun", "train.py"])
    body["metadata"]["generation"] = generation
    if refused is not None:
        conditions = refusal_conditions(*refused)
        status: dict[str, Any] = {}
    elif record is not None:
        conditions = conditions_for(record)
        status = record_status(record)
    else:
        return body
    status["observedGeneration"] = observed
    status["conditions"] = render_conditions(conditions, [], observed, T0)
    body["status"] = status
    return body


def at(body: dict[str, Any], version: int, **meta: Any) -> dict[str, Any]:
    """``body`` as the API server serves it at resourceVersion ``version``."""
    shown = copy.deepcopy(body)
    shown["spec"]["kubeflow"] = {"image": "pytorch/pytorch:2.4"}
    shown["metadata"].update(resourceVersion=str(version), uid="uid-1", finalizers=[FINALIZER], **meta)
    return shown


def _cancelled() -> Record:
    """Cancelled by a human while submission 1 runs, settled: what the supervisor really writes
    for a cancel (its own decision, not a hand-made outcome)."""
    asked = AUTHORIZED.model_copy(update={"cancel": CancelRequest(actor=ADA, time=T0)})
    outcome = decide(asked, []).step
    assert isinstance(outcome, RecordOutcome)
    return step(asked, outcome, RecordSettled())


PENDING = seed_record()
AUTHORIZED = step(PENDING, Authorize(1), RecordCanonical(1, "finetune-1"))
RECOVERING = step(AUTHORIZED, Authorize(2, rule=0, cause=PREEMPTED), RecordCanonical(2, "finetune-2"))
SUCCEEDED_ENDING = step(RECOVERING, RecordOutcome(State.SUCCEEDED, SUCCESS))
SUCCEEDED = step(SUCCEEDED_ENDING, RecordSettled())
FAILED_ENDING = step(AUTHORIZED, RecordOutcome(State.FAILED, OOM))
FAILED = step(FAILED_ENDING, RecordSettled())
CANCELLED = _cancelled()
SUSPENDED = step(AUTHORIZED, RecordSuspend(ADA))
"""Suspended by a person: submission 1 stopped, none authorized after it."""

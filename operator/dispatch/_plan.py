"""The plan: who enforces each rule, and which causes no rule covers, computed before anything runs."""

from __future__ import annotations

from . import _registry
from ._change import describe
from ._errors import PlanError
from ._model import (
    DEFAULT_GRACE_SECONDS,
    FAILURE_CAUSES,
    Action,
    Capabilities,
    CauseKind,
    Change,
    Enforcer,
    JobSpec,
    LimitPlan,
    MemoryChange,
    Plan,
    PlannedRule,
    QueuePlan,
    Rule,
    bytes_quantity,
    quantity_bytes,
    uncovered_codes,
)


def make_plan(job: str, spec: JobSpec, capabilities: Capabilities, *, supervised: bool) -> Plan:
    """Give each rule an enforcer or refuse the job.

    A rule goes to the scheduler only where the backend enforces it natively and exactly (its causes,
    its action and its budget), because a scheduler that does *roughly* what the rule says would fire
    it on causes the user did not list or more often than the budget allows. Otherwise it goes to the
    supervisor, which can only resubmit, and only if one will run. A rule with ``exitCodes`` is
    never the scheduler's: no native rule tells a code's exit from an out-of-memory kill or a failed
    start that shows the same code.

    A rule's backoff is the supervisor's: a scheduler restarts on its own schedule (each native
    rule says which: :attr:`~dispatch.NativeRule.backoff`), so a rule with a backoff never goes to
    the scheduler. A ``resubmit`` rule then goes to the supervisor, which waits it out exactly; a
    ``restart`` rule, which only a scheduler can carry out, is refused, naming the field. A rule's
    change is the supervisor's alike (a restart in place runs the same object), and a change the
    backend cannot make is refused, naming the field (:func:`_check_change`).
    """
    for i, rule in enumerate(spec.recovery.rules):
        if rule.change is not None:
            _check_change(f"spec.recovery.rules[{i}].change", rule.change, spec, capabilities)
    planned = tuple(
        _planned(i, rule, capabilities, supervised=supervised) for i, rule in enumerate(spec.recovery.rules)
    )
    covered = {cause for rule in spec.recovery.rules if rule.exit_codes is None for cause in rule.on}
    codes = uncovered_codes([r.exit_codes for r in spec.recovery.rules if r.exit_codes is not None])
    if codes is None and any(r.exit_codes is not None for r in spec.recovery.rules):
        covered.add(CauseKind.NON_ZERO_EXIT)  # rules with codes cover every one of them
    _grace(spec, capabilities)
    if spec.deadline_seconds is None:
        covered.add(CauseKind.DEADLINE_EXCEEDED)  # no deadline: not a cause this job can end with
    return Plan(
        job=job,
        rules=planned,
        uncovered=tuple(c for c in FAILURE_CAUSES if c not in covered),
        uncovered_exit_codes=codes,
        queue=_queue(spec, capabilities),
        time_limit=_time_limit(spec, capabilities, supervised=supervised),
        deadline=_deadline(spec, supervised=supervised),
    )


def _time_limit(spec: JobSpec, capabilities: Capabilities, *, supervised: bool) -> LimitPlan | None:
    """Who ends each submission at ``spec.timeLimitSeconds``: the scheduler where it does exactly
    that by itself (and, with a warning, can send it too), else the supervisor, counting from the
    submission's observed start."""
    seconds = spec.time_limit_seconds
    if seconds is None:
        return None
    warning = spec.stop.warning_seconds
    native = capabilities.time_limit
    if native is not None and (warning is None or capabilities.warning_signal):
        return LimitPlan(seconds=seconds, enforcer=Enforcer.SCHEDULER, how=native)
    if (
        warning is not None
        and spec.stop.warning_signal.value != "SIGTERM"
        and not capabilities.warning_signal
    ):
        raise PlanError(
            None,
            f"this backend's scheduler cannot send {spec.stop.warning_signal} before the time limit: "
            "dispatch's stop warns with SIGTERM only; set spec.stop.warningSignal to SIGTERM",
            field="spec.stop.warningSignal",
        )
    if not supervised:
        raise PlanError(
            None,
            "the scheduler does not end a submission at its time limit by itself and no supervisor will run",
            field="spec.timeLimitSeconds",
        )
    begins = (
        f"{warning} s before the limit, SIGKILL at the limit"
        if warning
        else (f"at the limit, SIGKILL {spec.stop.grace_period_seconds} s later")
    )
    how = f"the supervisor stops it {seconds} s after it started running (SIGTERM {begins})"
    return LimitPlan(seconds=seconds, enforcer=Enforcer.SUPERVISOR, how=how)


def _grace(spec: JobSpec, capabilities: Capabilities) -> None:
    """A grace period the backend cannot give is refused, not silently replaced by its own."""
    grace = spec.stop.grace_period_seconds
    if capabilities.stop_grace is not None and grace != DEFAULT_GRACE_SECONDS:
        raise PlanError(
            None,
            f"this backend's stop cannot give {grace} s: its grace is {capabilities.stop_grace}; "
            f"leave spec.stop.gracePeriodSeconds at its default ({DEFAULT_GRACE_SECONDS})",
            field="spec.stop.gracePeriodSeconds",
        )


def _deadline(spec: JobSpec, *, supervised: bool) -> LimitPlan | None:
    """The job's deadline is always the supervisor's: no scheduler sees the job across submissions."""
    seconds = spec.deadline_seconds
    if seconds is None:
        return None
    if not supervised:
        raise PlanError(
            None,
            "the job's deadline spans its submissions, which only dispatch's supervisor sees, and no "
            "supervisor will run",
            field="spec.deadlineSeconds",
        )
    how = (
        f"the supervisor ends the job {seconds} s after its submission, waits and backoffs included: "
        "the live submission is stopped, the job fails with cause deadline-exceeded, nothing is resubmitted"
    )
    return LimitPlan(seconds=seconds, enforcer=Enforcer.SUPERVISOR, how=how)


def _check_change(where: str, change: Change, spec: JobSpec, capabilities: Capabilities) -> None:
    """Refuse a change the backend cannot make, naming its field: a Kueue field where Kueue does
    not queue the job, more memory where the backend's options hold none (or a max below it)."""
    for field, value in (("queue", change.queue), ("workloadPriorityClass", change.workload_priority_class)):
        if value is None:
            continue
        if spec.queue is None:
            why = "a change of Kueue's fields needs spec.queue (the job is Kueue's from its first submission)"
            raise PlanError(None, why, field=f"{where}.{field}")
        if not capabilities.queues:
            why = (
                f"Kueue cannot queue this backend's jobs (backends it can: {', '.join(_queueing_backends())})"
            )
            raise PlanError(None, why, field=f"{where}.{field}")
    if change.memory is not None:
        _check_memory(f"{where}.memory", change.memory, spec)
    if change.time_limit is not None:
        if spec.time_limit_seconds is None:
            why = "no time limit is set to lengthen (set spec.timeLimitSeconds)"
            raise PlanError(None, why, field=f"{where}.timeLimit")
        if change.time_limit.max_seconds < spec.time_limit_seconds:
            why = (
                f"maxSeconds {change.time_limit.max_seconds} is less than spec.timeLimitSeconds "
                f"({spec.time_limit_seconds}): the time limit would never grow"
            )
            raise PlanError(None, why, field=f"{where}.timeLimit.maxSeconds")


def _check_memory(where: str, memory: MemoryChange, spec: JobSpec) -> None:
    held = [(name, options) for name, options in spec.options.items() if options.memory_bytes() is not None]
    if not held:
        fields = [
            f"spec.{name}.{options.memory_field}"
            for name, options in spec.options.items()
            if options.memory_field is not None
        ]
        hint = f"set {' or '.join(fields)}" if fields else "the backend's options hold no memory"
        raise PlanError(None, f"no memory of each node is set to change ({hint})", field=where)
    cap = quantity_bytes(memory.max)
    for name, options in held:
        now = options.memory_bytes() or 0
        if cap < now:
            raise PlanError(
                None,
                f"max {memory.max} is less than spec.{name}.{options.memory_field} "
                f"({bytes_quantity(now)}): the memory would never grow",
                field=f"{where}.max",
            )


def _queue(spec: JobSpec, capabilities: Capabilities) -> QueuePlan | None:
    """Kueue's part, for a job that names a LocalQueue; refused where Kueue cannot queue the objects
    (Slurm, the memory scheduler, a cluster without Kueue): the job would otherwise start unqueued."""
    if spec.queue is None:
        return None
    if not capabilities.queues:
        raise PlanError(
            None,
            f"Kueue cannot queue this backend's jobs (LocalQueue {spec.queue!r}): spec.queue works only "
            f"with a backend whose kind Kueue integrates ({', '.join(_queueing_backends())}), on a "
            "cluster that serves workloads.kueue.x-k8s.io",
            field="spec.queue",
        )
    return QueuePlan(queue=spec.queue, workload_priority_class=spec.workload_priority_class)


def _queueing_backends() -> tuple[str, ...]:
    """The registered backends whose kinds Kueue integrates (their declared capabilities say so)."""
    return tuple(name for name, info in _registry.registered().items() if info.capabilities.queues)


def _planned(index: int, rule: Rule, capabilities: Capabilities, *, supervised: bool) -> PlannedRule:
    native = next((n for n in capabilities.native if n.enforces(rule)), None)
    if native is not None and _schedulers(rule):
        enforcer = Enforcer.SCHEDULER
    elif native is not None and not (rule.action is Action.RESUBMIT and supervised):
        if rule.backoff is not None:
            why = f"waits its own backoff ({native.backoff}), not dispatch's; remove the backoff"
            field = "backoff"
        else:
            why = "restarts the same object in place, which changes nothing; remove the change"
            field = "change"
        raise PlanError(
            index,
            f"spec.recovery.rules[{index}].{field}: this {rule.action} rule is the scheduler's, which {why}",
        )
    else:
        enforcer = _enforcer(index, rule, capabilities, supervised=supervised)
    return PlannedRule(
        index=index,
        on=rule.on,
        action=rule.action,
        budget=rule.budget,
        enforcer=enforcer,
        exit_codes=rule.exit_codes,
        backoff=rule.backoff,
        scheduler_backoff=native.backoff if enforcer is Enforcer.SCHEDULER and native is not None else None,
        change=describe(rule.change) if rule.change is not None else None,
    )


def _schedulers(rule: Rule) -> bool:
    """Whether a rule the scheduler enforces natively may be left to it: a scheduler restarts on
    its own schedule and with the same object, so a rule with a backoff or a change is dispatch's."""
    return rule.backoff is None and rule.change is None


def _enforcer(index: int, rule: Rule, capabilities: Capabilities, *, supervised: bool) -> Enforcer:
    if _schedulers(rule) and any(native.enforces(rule) for native in capabilities.native):
        return Enforcer.SCHEDULER
    if rule.action is Action.RESUBMIT and supervised:
        return Enforcer.SUPERVISOR
    causes = " ".join(c.value for c in rule.on)
    codes = f" exitCodes {rule.exit_codes.describe()}" if rule.exit_codes is not None else ""
    what = f"{rule.action} on [{causes}]{codes} with budget {rule.budget}"
    native = "; ".join(n.describe() for n in capabilities.native) or "nothing"
    if rule.exit_codes is not None and rule.action is Action.RESTART:
        why = (
            f"only a scheduler can {rule.action} in place, and none enforces {what} exactly (a "
            "container's exit code does not tell an exit from an out-of-memory kill or a failed "
            "start that shows the same code); a resubmit rule with exitCodes is the supervisor's"
        )
    elif rule.action is Action.RESUBMIT:
        why = (
            f"the scheduler does not enforce {what} natively (it enforces {native}) "
            "and no supervisor will run"
        )
    else:
        why = (
            f"only a scheduler can {rule.action} in place, and this one does not enforce {what} "
            f"(it enforces {native})"
        )
    raise PlanError(index, why)

"""Turning DispatchJobs into what the plugin prints: plans, summaries, tables, JSON and YAML."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import yaml

from .._constants import (
    ANNOTATION_SUBMITTED_BY,
    STATUS_OBSERVED_CAUSE,
    STATUS_OBSERVED_NOTE,
    STATUS_OBSERVED_STATE,
)
from .._cost import Failure, failures
from .._dispatchjob import (
    cause_text,
    condition,
    cost_of,
    plan_of,
    record_from,
    refusal,
    status_of,
    submissions,
    transitions,
)
from .._errors import DispatchError
from .._model import (
    ActorKind,
    Cause,
    CauseKind,
    Cost,
    Plan,
    PlannedRule,
    SimulatedEnd,
    Simulation,
    State,
    Transition,
    cause_words,
    rule_causes,
)

Body = Mapping[str, Any]

WIDTH = 100
"""What ``describe`` fits in: a long value wraps under itself."""


# ---- the plan ---------------------------------------------------------------------------------------


def plan_lines(plan: Plan) -> list[str]:
    """The tutorial's lines: who enforces each rule, then the causes no rule covers."""
    lines = [
        line
        for rule in plan.rules
        for line in (f"rule {rule.index} is enforced by the {rule.enforcer}", *rule_lines(rule))
    ]
    lines.append("uncovered: [" + " ".join(c.value for c in plan.uncovered) + "]")
    return lines + uncovered_code_lines(plan) + queue_lines(plan) + limit_lines(plan)


def limit_lines(plan: Plan) -> list[str]:
    """Who ends each submission at its time limit, and the job at its deadline."""
    lines: list[str] = []
    for what, limit in (("time limit", plan.time_limit), ("deadline", plan.deadline)):
        if limit is not None:
            lines += [f"{what} {limit.seconds} s is enforced by the {limit.enforcer}", f"  {limit.how}"]
    return lines


def uncovered_code_lines(plan: Plan) -> list[str]:
    """The exit codes of non-zero-exit no rule covers, when rules with exitCodes cover the others."""
    codes = plan.uncovered_exit_codes
    return [] if codes is None else [f"uncovered exit codes of non-zero-exit: {codes.describe()}"]


def rule_lines(rule: PlannedRule) -> list[str]:
    """The wait before a rule's firings (its own backoff, or the scheduler's for a native rule),
    and what each firing changes in the submission it authorizes."""
    lines: list[str] = []
    if rule.backoff is not None:
        lines.append(f"  backoff: {rule.backoff.describe()}")
    elif rule.scheduler_backoff is not None:
        lines.append(f"  the scheduler's own backoff: {rule.scheduler_backoff}")
    if rule.change is not None:
        lines.append(f"  each firing changes the next submission: {rule.change}")
    return lines


def queue_lines(plan: Plan) -> list[str]:
    """Kueue's part of the plan (spec.queue): what Kueue enforces and what stays dispatch's."""
    queue = plan.queue
    if queue is None:
        return []
    priority = f", priority class {queue.workload_priority_class}" if queue.workload_priority_class else ""
    return [
        f"queued by Kueue in LocalQueue {queue.queue}{priority}",
        "  enforced by Kueue: " + ", ".join(queue.kueue),
        "  enforced by dispatch: " + ", ".join(queue.dispatch),
    ]


def simulation_lines(sim: Simulation) -> list[str]:
    """The "what if" table: each end, the rule that fired, the backoff, what changes, the outcome."""
    rows = [
        [
            end.submission,
            _cause_words(end.cause),
            "-" if end.rule is None else end.rule,
            f"{end.backoff_seconds:g}s" if end.rule is not None and not end.in_place else "-",
            _next(end),
            "-" if end.budget_left is None else end.budget_left,
            end.change or "-",
            end.state.value,
        ]
        for end in sim.ends
    ]
    headers = ["SUBMISSION", "CAUSE", "RULE", "BACKOFF", "NEXT", "LEFT", "CHANGE", "STATE"]
    lines = table(headers, rows).splitlines()
    last = sim.ends[-1].submission if sim.ends else 0
    if sim.state is State.SUCCEEDED:
        lines.append(f"ends: succeeded in submission {last}")
    else:
        lines.append(f"ends: {sim.state.value} in submission {last} with cause {_cause_words(sim.cause)}")
    if sim.unused:
        lines.append("never met: " + ", ".join(_cause_words(c) for c in sim.unused))
    return lines


def _next(end: SimulatedEnd) -> str:
    if end.in_place:
        return f"{end.submission} (restarted in place)"
    return "-" if end.next_submission is None else str(end.next_submission)


def _cause_words(cause: Cause) -> str:
    return "success" if cause.kind is CauseKind.NONE else cause_words(cause.kind.value, cause.exit_code)


def simulation_data(sim: Simulation) -> dict[str, Any]:
    """The simulation as data: its ends and where the job ends (the simulated record left out)."""
    return sim.model_dump(mode="json", by_alias=True, exclude={"record"})


def plan_data(plan: Plan) -> dict[str, Any]:
    return plan.model_dump(mode="json", by_alias=True)


# ---- machine output ---------------------------------------------------------------------------------


def dump(data: Any, output: str) -> str:
    if output == "json":
        return json.dumps(data, indent=2, ensure_ascii=False)
    if output == "yaml":
        return yaml.safe_dump(data, sort_keys=False, allow_unicode=True).rstrip("\n")
    raise ValueError(f"unknown output format {output!r}")


# ---- tables -----------------------------------------------------------------------------------------


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], width: int | None = None) -> str:
    """Columns as kubectl prints them: upper-case headers, left-aligned, three spaces apart. With
    ``width``, the last column wraps under itself so no line is longer."""
    cells = [[str(h) for h in headers], *[[_cell(v) for v in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for r in cells:
        head = "   ".join(c.ljust(w) for c, w in zip(r[:-1], widths, strict=False))
        lead = len(head) + 3 if head else 0
        if width is None or lead + len(r[-1]) <= width or width - lead < 20:
            lines.append((head + "   " + r[-1] if head else r[-1]).rstrip())
            continue
        parts = textwrap.wrap(r[-1], width - lead, break_on_hyphens=False) or [""]
        lines.append(head + "   " + parts[0])
        lines.extend(" " * lead + part for part in parts[1:])
    return "\n".join(lines)


def wrap(text: str, indent: int, width: int = WIDTH, first: str = "") -> list[str]:
    """``first`` then ``text``, wrapped to ``width``, the lines after the first indented ``indent``."""
    return textwrap.wrap(
        " ".join(text.split()),
        width,
        initial_indent=first,
        subsequent_indent=" " * indent,
        break_on_hyphens=False,
    ) or [first.rstrip()]


def _cell(value: object) -> str:
    if value is None or value == "":
        return "-"
    return " ".join(str(value).split())


def age(timestamp: str | None, now: datetime | None = None) -> str:
    """kubectl's short age: 45s, 12m, 3h, 5d."""
    when = parse_time(timestamp)
    if when is None:
        return "-"
    seconds = int(((now or datetime.now(UTC)) - when).total_seconds())
    if seconds < 0:
        seconds = 0
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size * (2 if unit != "m" else 1):
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def parse_time(value: object) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def show_time(value: object) -> str:
    when = parse_time(value) if not isinstance(value, datetime) else value
    if when is None:
        return "-"
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---- reading a DispatchJob --------------------------------------------------------------------------


def _actor(value: object) -> str | None:
    if isinstance(value, Mapping) and value.get("id"):
        return f"{value.get('kind', 'human')}:{value['id']}"
    return None


def _cause(value: object) -> dict[str, Any] | None:
    if isinstance(value, Mapping) and value.get("kind"):
        keys = ("kind", "detail", "exitCode", "signal")
        return {k: value[k] for k in keys if value.get(k) not in (None, "")}
    return None


def _cause_text(cause: Mapping[str, Any] | None) -> str:
    if not cause:
        return "-"
    text = cause_text(str(cause["kind"]), cause.get("detail"), cause.get("exitCode"), cause.get("signal"))
    return f"{text} (stop {cause['stop']})" if cause.get("stop") else text


def transition_data(t: Transition) -> dict[str, Any]:
    return {
        "time": show_time(t.time),
        "from": t.from_.value,
        "to": t.to.value,
        "submission": t.submission,
        "cause": t.cause.model_dump(mode="json", by_alias=True, exclude_defaults=True),
        "actor": str(t.actor),
    }


def summary(obj: Body) -> dict[str, Any]:
    """What ``get`` shows of one DispatchJob (all of it with ``-o json|yaml``)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = status_of(obj)
    subs = submissions(obj)
    plan = plan_of(obj)
    ready = condition(obj)
    submitted_by = _actor(status.get("submittedBy")) or (meta.get("annotations") or {}).get(
        ANNOTATION_SUBMITTED_BY
    )
    return {
        "namespace": meta.get("namespace"),
        "name": meta.get("name"),
        "backend": spec.get("backend"),
        "state": status.get(STATUS_OBSERVED_STATE) or status.get("state"),
        "recordedState": status.get("state"),
        "shownCause": status.get(STATUS_OBSERVED_CAUSE),
        "cause": _cause(status.get("cause")),
        "submission": subs[-1].n if subs else None,
        "recoveries": sum(r.firings for r in plan.rules) if plan is not None else 0,
        "settled": bool(status.get("settled", False)),
        "cancel": bool(spec.get("cancel", False)),
        "submittedBy": submitted_by,
        "submittedAt": status.get("submittedAt"),
        "ready": ready.get("status") if ready else None,
        "reason": ready.get("reason") if ready else None,
        "message": ready.get("message") if ready else None,
        "note": status.get(STATUS_OBSERVED_NOTE) or None,
        "refused": refusal(obj),
        "created": meta.get("creationTimestamp"),
    }


def get_table(objs: Sequence[Body], *, all_namespaces: bool, now: datetime | None = None) -> str:
    headers = [
        "NAME",
        "BACKEND",
        "STATE",
        "CAUSE",
        "SUBMISSION",
        "RECOVERIES",
        "READY",
        "REASON",
        "SUBMITTED-BY",
    ]
    headers.append("AGE")
    if all_namespaces:
        headers.insert(0, "NAMESPACE")
    rows = []
    for obj in objs:
        s = summary(obj)
        row: list[object] = [
            s["name"],
            s["backend"],
            s["state"],
            s["shownCause"],
            s["submission"],
            s["recoveries"],
            s["ready"],
            s["reason"],
            s["submittedBy"],
            age(s["created"], now),
        ]
        if all_namespaces:
            row.insert(0, s["namespace"])
        rows.append(row)
    return table(headers, rows)


def failures_of(obj: Body) -> dict[int, Failure]:
    """Each failed submission of a DispatchJob with what it cost (dispatch._cost), by its number;
    none when its record cannot be read."""
    try:
        record = record_from(obj)
    except (ValueError, DispatchError):
        return {}
    return {f.submission: f for f in failures(record)}


def failure_of(t: Transition, failed: Mapping[int, Failure]) -> Failure | None:
    """The failure a transition records: the previous submission's for a recovery (it authorizes
    the next), the submission's own for a failed outcome."""
    if t.submission is None:
        return None
    if t.to is State.RECOVERING:
        return failed.get(t.submission - 1)
    return failed.get(t.submission) if t.to is State.FAILED else None


def failure_words(f: Failure | None) -> str:
    """What a failure cost, in a history row: ``60 node-s, running again after 5 s``."""
    if f is None:
        return ""
    gpu = f", {seconds(f.gpu_seconds)} GPU-s" if f.gpu_seconds else ""
    back = (
        f"running again after {seconds(f.recovery_seconds)} s"
        if f.recovery_seconds is not None
        else "not running again yet"
    )
    return f"{seconds(f.node_seconds)} node-s{gpu}, {back}"


def failure_data(f: Failure | None) -> dict[str, Any] | None:
    if f is None:
        return None
    return {
        "submission": f.submission,
        "nodeSeconds": round(f.node_seconds, 3),
        "gpuSeconds": round(f.gpu_seconds, 3),
        "recoverySeconds": round(f.recovery_seconds, 3) if f.recovery_seconds is not None else None,
    }


def history_table(ts: Sequence[Transition], failed: Mapping[int, Failure] | None = None) -> str:
    """The transitions; with ``failed`` (:func:`failures_of`), what each failure cost besides."""
    rows = [
        [
            show_time(t.time),
            t.from_.value,
            t.to.value,
            t.submission,
            _cause_text(_cause_model(t)),
            str(t.actor),
        ]
        for t in ts
    ]
    headers = ["TIME", "FROM", "TO", "SUBMISSION", "CAUSE", "ACTOR"]
    if failed:
        headers.append("COST")
        for row, t in zip(rows, ts, strict=True):
            row.append(failure_words(failure_of(t, failed)))
    return table(headers, rows)


def _cause_model(t: Transition) -> dict[str, Any]:
    return t.cause.model_dump(mode="json", by_alias=True, exclude_defaults=True) | {
        "kind": t.cause.kind.value
    }


def describe_data(obj: Body, events: Sequence[Body] = ()) -> dict[str, Any]:
    """Everything ``describe`` shows, as data."""
    status = status_of(obj)
    plan = plan_of(obj)
    data = summary(obj)
    data["spec"] = dict(obj.get("spec") or {})
    data["plan"] = plan_data(plan) if plan is not None else None
    data["submissions"] = [
        {
            "n": s.n,
            "authorizedBy": str(s.authorized_by),
            "authorizedAt": show_time(s.authorized_at),
            "rule": s.rule,
            "object": s.canonical,
            "cause": s.cause.model_dump(mode="json", by_alias=True, exclude_defaults=True)
            | {"kind": s.cause.kind.value}
            if s.cause is not None
            else None,
            "restarts": s.restarts,
            "changes": [str(c) for c in s.changes],
        }
        for s in submissions(obj)
    ]
    timed = {t["n"]: t for t in timeline(obj, data["state"])}
    for sub in data["submissions"]:
        sub.update({k: timed[sub["n"]][k] for k in ("endedAt", "by", "outcome")})
    for sub, recorded in zip(data["submissions"], submissions(obj), strict=True):
        sub["startedAt"] = show_time(recorded.started_at) if recorded.started_at is not None else None
    cost = cost_of(obj)
    data["cost"] = cost.model_dump(mode="json", by_alias=True) if cost is not None else None
    data["history"] = [transition_data(t) for t in transitions(obj)]
    cancel = status.get("cancel")
    data["cancelRequest"] = (
        {"actor": _actor(cancel.get("actor")), "time": cancel.get("time")}
        if isinstance(cancel, Mapping)
        else None
    )
    data["conditions"] = [dict(c) for c in status.get("conditions") or () if isinstance(c, Mapping)]
    data["events"] = [event_data(e) for e in events]
    return data


def event_data(event: Body) -> dict[str, Any]:
    when = event.get("eventTime") or event.get("lastTimestamp") or event.get("firstTimestamp")
    if when is None:
        when = (event.get("metadata") or {}).get("creationTimestamp")
    return {
        "time": show_time(when),
        "type": event.get("type"),
        "reason": event.get("reason"),
        "message": event.get("note") or event.get("message"),
    }


def describe_text(data: Mapping[str, Any]) -> str:
    """``describe`` for a person: at most :data:`WIDTH` columns, long values wrapped under themselves."""
    out: list[str] = []

    def field(label: str, value: object) -> None:
        out.extend(wrap(_cell(value), 14, first=f"{label + ':':<14}"))

    field("Name", data["name"])
    field("Namespace", data["namespace"])
    field("Backend", data["backend"])
    if data.get("refused"):  # nothing was recorded: no submitter, no plan
        field("Refused", f"{data['refused']}: {data['message'] or ''}")
    elif data["submittedBy"]:
        field("Submitted by", f"{data['submittedBy']} at {show_time(data['submittedAt'])}")
    if not data.get("refused"):  # a refused job has no state: the Refused line says why
        state = data["state"] or "-"
        if data["submission"]:
            state += f" (submission {data['submission']})"
        field("State", state)
    if data["cause"] and data["cause"].get("kind") != "none":
        field("Last cause", _cause_text(data["cause"]))
    field("Settled", "yes" if data["settled"] else "no")
    if data["ready"] is not None and not data.get("refused"):
        field("Ready", f"{data['ready']} ({data['reason']}): {data['message'] or ''}")
    if data.get("note"):
        field("Note", data["note"])  # why the current object does not run (held, or no room yet)
    cancel = data.get("cancelRequest")
    if cancel:
        field("Cancel", f"requested by {cancel['actor']} at {show_time(cancel['time'])}")
    elif data["cancel"]:
        field("Cancel", "requested")
    plan = data.get("plan")
    if plan is not None:
        out.append("Plan:")
        p = Plan.model_validate(plan)
        for rule in p.rules:
            causes = rule_causes(rule.on, rule.exit_codes)
            line = (
                f"rule {rule.index} ({rule.enforcer}): {rule.action} on [{causes}], "
                f"budget {rule.budget}, fired {rule.firings}, {rule.left} left"
            )
            out.extend(wrap(line, 4, first="  "))
            out.extend(f"  {line}" for line in rule_lines(rule))
        out.extend(wrap("uncovered: [" + " ".join(c.value for c in p.uncovered) + "]", 4, first="  "))
        out.extend(f"  {line}" for line in uncovered_code_lines(p) + queue_lines(p) + limit_lines(p))
        out.append("Submissions:")
        rows = [
            [s["n"], s["authorizedAt"], _same_day(s["authorizedAt"], s["endedAt"]), s["by"], s["outcome"]]
            for s in data["submissions"]
        ]
        out.append(_indent(table(["N", "STARTED", "ENDED", "BY", "OUTCOME"], rows, WIDTH - 2)))
        if not rows:
            out.append("  (none yet)")
        for s in data["submissions"]:
            for change in s.get("changes") or ():
                out.extend(wrap(f"submission {s['n']} changed {change}", 4, first="  "))
    cost = data.get("cost")
    if cost:
        out.extend(cost_lines(Cost.model_validate(cost)))
    if data["history"]:
        out.append("History:")
        rows = [
            [h["time"], h["from"], h["to"], h["submission"], h["actor"], _cause_text(h["cause"])]
            for h in data["history"]
        ]
        out.append(_indent(table(["TIME", "FROM", "TO", "N", "ACTOR", "CAUSE"], rows, WIDTH - 2)))
    if data["conditions"]:
        out.append("Conditions:")
        rows = [
            [c.get("type"), c.get("status"), c.get("reason"), c.get("message")] for c in data["conditions"]
        ]
        out.append(_indent(table(["TYPE", "STATUS", "REASON", "MESSAGE"], rows, WIDTH - 2)))
    out.append("Events:")
    if data["events"]:
        rows = [[e["time"], e["type"], e["reason"], e["message"]] for e in data["events"]]
        out.append(_indent(table(["TIME", "TYPE", "REASON", "MESSAGE"], rows, WIDTH - 2)))
    else:
        out.append("  (none)")
    return "\n".join(out)


def seconds(value: float) -> str:
    """Seconds as status has them (to the millisecond), shown to a tenth: ``2240``, ``12.5``."""
    return f"{value:.1f}".removesuffix(".0")


def cost_lines(cost: Cost) -> list[str]:
    """What recovery cost, as ``describe`` shows it: the totals, then a row per cause."""
    out = ["Recovery cost:"]
    total = (
        f"{cost.failures} failure{'s' if cost.failures != 1 else ''}, {cost.recovered} recovered "
        f"in {seconds(cost.recovery_seconds)} s; {seconds(cost.node_seconds)} node-seconds, "
        f"{seconds(cost.gpu_seconds)} GPU-seconds lost"
    )
    out.extend(wrap(total, 4, first="  "))
    rows = [
        [
            c.cause.value,
            c.failures,
            c.recovered,
            seconds(c.recovery_seconds),
            seconds(c.longest_recovery_seconds),
            seconds(c.node_seconds),
            seconds(c.gpu_seconds),
        ]
        for c in cost.causes
    ]
    headers = ["CAUSE", "FAILURES", "RECOVERED", "RECOVERY-S", "LONGEST-S", "NODE-S", "GPU-S"]
    out.append(_indent(table(headers, rows, WIDTH - 2)))
    return out


def _same_day(start: str | None, end: str | None) -> str | None:
    """``end`` without its date when it is ``start``'s (the timeline stays narrow)."""
    if start and end and start[:11] == end[:11]:
        return end[11:]
    return end


def timeline(obj: Body, state: str | None) -> list[dict[str, Any]]:
    """Each submission: when it was authorized, when it ended (the next one's authorization, or the
    outcome's transition), who started it, and how it ended (its cause, or the state status shows
    for the one still going)."""
    subs = submissions(obj)
    ts = transitions(obj)
    out = []
    for i, s in enumerate(subs):
        ended: datetime | None = None
        if i + 1 < len(subs):
            ended = subs[i + 1].authorized_at
        else:
            ended = next((t.time for t in reversed(ts) if t.to.is_outcome and t.submission == s.n), None)
        if s.cause is not None:
            outcome = (
                cause_text(s.cause.kind.value, s.cause.detail, s.cause.exit_code, s.cause.signal)
                if s.cause.kind.value != "none"
                else "succeeded"
            )
        elif i + 1 < len(subs) or ended is not None:
            outcome = "ended"
        else:
            outcome = state or "-"
        if s.rule is not None:
            by = f"rule {s.rule}"
        else:
            by = "start" if s.authorized_by.kind is ActorKind.SUPERVISOR else str(s.authorized_by)
        out.append(
            {
                "n": s.n,
                "authorizedAt": show_time(s.authorized_at),
                "endedAt": show_time(ended) if ended is not None else None,
                "by": by,
                "outcome": outcome,
            }
        )
    return out


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


def watch_key(obj: Body) -> tuple[Any, ...]:
    """What has to change for ``watch`` to print a new line."""
    s = summary(obj)
    return (
        s["state"],
        s["shownCause"],
        json.dumps(s["cause"], sort_keys=True),
        s["submission"],
        len(transitions(obj)),
        s["settled"],
        s["ready"],
        s["reason"],
        s["cancel"],
    )


def watch_line(obj: Body, now: datetime | None = None) -> str:
    s = summary(obj)
    ts = transitions(obj)
    what = ""
    if ts:
        last = ts[-1]
        what = f"last: {last.from_} -> {last.to} (submission {last.submission}, by {last.actor})"
    elif s["message"]:
        what = str(s["message"])
    parts = [
        show_time(now or datetime.now(UTC)),
        f"{s['namespace']}/{s['name']}",
        f"state={s['state'] or '-'}",
        f"cause={s['shownCause'] or '-'}",
        f"submission={s['submission'] or '-'}",
        f"ready={s['ready'] or '-'}/{s['reason'] or '-'}",
    ]
    if s["settled"]:
        parts.append("settled")
    if what:
        parts.append(what)
    return "  ".join(parts)

"""Turning DispatchJobs into what the plugin prints: plans, summaries, tables, JSON and YAML."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import yaml

from .._constants import ANNOTATION_SUBMITTED_BY, STATUS_OBSERVED_NOTE
from .._dispatchjob import condition, plan_of, status_of, submissions, transitions
from .._model import Plan, PlannedRule, Transition

Body = Mapping[str, Any]


# ---- the plan ---------------------------------------------------------------------------------------


def plan_lines(plan: Plan) -> list[str]:
    """The tutorial's lines: who enforces each rule, then the causes no rule covers."""
    lines = [
        line
        for rule in plan.rules
        for line in (f"rule {rule.index} is enforced by the {rule.enforcer}", *backoff_lines(rule))
    ]
    lines.append("uncovered: [" + " ".join(c.value for c in plan.uncovered) + "]")
    return lines + queue_lines(plan)


def backoff_lines(rule: PlannedRule) -> list[str]:
    """The wait before a rule's firings: its own backoff, or the scheduler's for a native rule."""
    if rule.backoff is not None:
        return [f"  backoff: {rule.backoff.describe()}"]
    if rule.scheduler_backoff is not None:
        return [f"  the scheduler's own backoff: {rule.scheduler_backoff}"]
    return []


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


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Columns as kubectl prints them: upper-case headers, left-aligned, three spaces apart."""
    cells = [[str(h) for h in headers], *[[_cell(v) for v in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


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
        return {k: value[k] for k in ("kind", "detail", "exitCode") if value.get(k) not in (None, "")}
    return None


def _cause_text(cause: Mapping[str, Any] | None) -> str:
    if not cause:
        return "-"
    text = str(cause["kind"])
    if cause.get("detail"):
        text += f": {cause['detail']}"
    return text


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
        "state": status.get("state"),
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
        cause = s["cause"]["kind"] if s["cause"] else None
        row: list[object] = [
            s["name"],
            s["backend"],
            s["state"],
            cause,
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


def history_table(ts: Sequence[Transition]) -> str:
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
    return table(["TIME", "FROM", "TO", "SUBMISSION", "CAUSE", "ACTOR"], rows)


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
        }
        for s in submissions(obj)
    ]
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
    out: list[str] = []

    def field(label: str, value: object) -> None:
        out.append(f"{label + ':':<14}{_cell(value)}")

    field("Name", data["name"])
    field("Namespace", data["namespace"])
    field("Backend", data["backend"])
    field("Submitted by", f"{data['submittedBy'] or '-'} at {show_time(data['submittedAt'])}")
    state = data["state"] or "-"
    if data["cause"] and data["cause"].get("kind") != "none":
        state += f" (cause {_cause_text(data['cause'])})"
    field("State", state)
    field("Settled", "yes" if data["settled"] else "no")
    if data["ready"] is not None:
        field("Ready", f"{data['ready']} ({data['reason']}): {data['message'] or ''}")
    if data.get("note"):
        field("Note", data["note"])  # why the current object does not run (held, or no room yet)
    cancel = data.get("cancelRequest")
    if cancel:
        field("Cancel", f"requested by {cancel['actor']} at {show_time(cancel['time'])}")
    elif data["cancel"]:
        field("Cancel", "requested")
    out.append("Plan:")
    plan = data.get("plan")
    if plan is None:
        out.append("  (none: the job was not accepted)")
    else:
        p = Plan.model_validate(plan)
        for rule in p.rules:
            causes = " ".join(c.value for c in rule.on)
            out.append(
                f"  rule {rule.index} is enforced by the {rule.enforcer}: {rule.action} on [{causes}], "
                f"budget {rule.budget}, fired {rule.firings}, {rule.left} left"
            )
            out.extend(f"  {line}" for line in backoff_lines(rule))
        out.append("  uncovered: [" + " ".join(c.value for c in p.uncovered) + "]")
        out.extend(f"  {line}" for line in queue_lines(p))
    out.append("Submissions:")
    if data["submissions"]:
        rows = [
            [
                s["n"],
                s["object"],
                _cause_text(s["cause"]),
                s["rule"],
                s["authorizedBy"],
                s["authorizedAt"],
                s["restarts"],
            ]
            for s in data["submissions"]
        ]
        out.append(
            _indent(
                table(["N", "OBJECT", "CAUSE", "RULE", "AUTHORIZED-BY", "AUTHORIZED-AT", "RESTARTS"], rows)
            )
        )
    else:
        out.append("  (none yet)")
    out.append("History:")
    if data["history"]:
        rows = [
            [h["time"], h["from"], h["to"], h["submission"], _cause_text(h["cause"]), h["actor"]]
            for h in data["history"]
        ]
        out.append(_indent(table(["TIME", "FROM", "TO", "SUBMISSION", "CAUSE", "ACTOR"], rows)))
    else:
        out.append("  (no transitions yet)")
    if data["conditions"]:
        out.append("Conditions:")
        rows = [
            [c.get("type"), c.get("status"), c.get("reason"), c.get("message")] for c in data["conditions"]
        ]
        out.append(_indent(table(["TYPE", "STATUS", "REASON", "MESSAGE"], rows)))
    out.append("Events:")
    if data["events"]:
        rows = [[e["time"], e["type"], e["reason"], e["message"]] for e in data["events"]]
        out.append(_indent(table(["TIME", "TYPE", "REASON", "MESSAGE"], rows)))
    else:
        out.append("  (none)")
    return "\n".join(out)


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


def watch_key(obj: Body) -> tuple[Any, ...]:
    """What has to change for ``watch`` to print a new line."""
    s = summary(obj)
    return (
        s["state"],
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
        f"cause={s['cause']['kind'] if s['cause'] else '-'}",
        f"submission={s['submission'] or '-'}",
        f"ready={s['ready'] or '-'}/{s['reason'] or '-'}",
    ]
    if s["settled"]:
        parts.append("settled")
    if what:
        parts.append(what)
    return "  ".join(parts)

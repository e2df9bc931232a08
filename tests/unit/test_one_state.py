"""One state everywhere: ``kubectl get dj`` (the CRD's printer columns), the plugin's ``get`` and
``describe``, the conditions and the GitOps tools' health say the same state of a job at every step.

The statuses are written by the operator's own code, as the record store writes them: a record
write (:func:`~dispatch._dispatchjob.record_write`, the store's ``put``) with the observed fields of
the decision that made it, then a write of the observed fields alone
(:func:`~dispatch._dispatchjob.observe_write`, the store's ``observe``) when the supervisor sees
the pods run. The printer columns are evaluated as the API server does (their JSONPaths, on the
object), with the small subset of JSONPath the CRD uses.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from dispatch import CauseKind, Record, State
from dispatch._cli import _render as render
from dispatch._constants import REASON_BACKEND_NOT_CONFIGURED, REASON_INVALID_SPEC
from dispatch._controller.crd import printer_columns
from dispatch._dispatchjob import (
    SHOWN_REASONS,
    observe_write,
    observed_fields,
    record_write,
    refusal,
    refusal_write,
)
from dispatch._model import NO_CAUSE, Cause
from tests.support import gitops
from tests.support.records import AUTHORIZED, PENDING, PREEMPTED, RECOVERING, SUCCEEDED, SUCCEEDED_ENDING, T0
from tests.support.records import dispatch_job as bare_job

TOKEN = re.compile(r'\.[A-Za-z]+|\[-1:\]|\[\?\(@\.(\w+)=="([^"]*)"\)\]')


def jsonpath(path: str, obj: Mapping[str, Any]) -> str:
    """A printer column's JSONPath on ``obj`` as kubectl shows the cell ("" for nothing): fields,
    the last item of a list (``[-1:]``) and a filter by one field (``[?(@.type=="Ready")]``). A
    column the subset cannot read fails here rather than being read wrong."""
    tokens = list(TOKEN.finditer(path))
    assert "".join(t.group(0) for t in tokens) == path, f"a JSONPath this test cannot read: {path}"
    values: list[Any] = [obj]
    for token in tokens:
        text = token.group(0)
        found: list[Any] = []
        for value in values:
            if text.startswith(".") and isinstance(value, Mapping) and text[1:] in value:
                found.append(value[text[1:]])
            elif text == "[-1:]" and isinstance(value, list):
                found.extend(value[-1:])
            elif token.group(1) and isinstance(value, list):
                found.extend(
                    v for v in value if isinstance(v, Mapping) and v.get(token.group(1)) == token.group(2)
                )
        values = found
    return ",".join(str(v) for v in values)


def columns(body: Mapping[str, Any], *, wide: bool = False) -> dict[str, str]:
    """The row ``kubectl get dj`` shows (``-o wide``: with the priority-1 columns), by column name."""
    return {
        c["name"]: jsonpath(c["jsonPath"], body) for c in printer_columns() if wide or not c.get("priority")
    }


def plugin_row(body: Mapping[str, Any]) -> dict[str, str]:
    """The row ``kubectl dispatch get`` prints, by header."""
    header, row = render.get_table([body], all_namespaces=False).splitlines()
    return dict(zip(re.split(r" {3,}", header), re.split(r" {3,}", row), strict=True))


def described(body: Mapping[str, Any], label: str) -> str | None:
    """The value of one ``describe`` field (``State``, ``Refused``), None when it is not shown."""
    for line in render.describe_text(render.describe_data(body)).splitlines():
        if line.startswith(f"{label}:"):
            return line[14:]
    return None


WAITING = (
    "pod finetune-1-master-0 unschedulable (no-capacity at 2025-01-02T03:10:05Z): 0/8 nodes are available"
)
"""The note of a submission whose pods no node can take yet."""


def written(
    record: Record, shown: State, cause: Cause, previous: Mapping[str, Any] | None, note: str = ""
) -> dict[str, Any]:
    """The DispatchJob after the operator wrote ``record`` and then what it sees (``shown``)."""
    body = bare_job(None)
    conditions = (previous or {}).get("conditions") or []
    now = T0 + timedelta(minutes=1)
    status = record_write(record, previous=conditions, generation=1, now=now, observed={})
    if not record.settled:
        status = observe_write(
            record,
            status,
            observed_fields(shown, cause, note),
            previous=status["conditions"],
            generation=1,
            now=now,
        )
    body["status"] = status
    return body


# (what happens, the record written, the state the supervisor sees, the cause it shows,
#  Argo CD's health, kstatus' verdict)
LIFECYCLE: list[tuple[str, Record, State, Cause, str, str]] = [
    ("planned", PENDING, State.PENDING, NO_CAUSE, "Progressing", "InProgress"),
    ("submission 1 waits", AUTHORIZED, State.PENDING, NO_CAUSE, "Progressing", "InProgress"),
    ("submission 1 runs", AUTHORIZED, State.RUNNING, NO_CAUSE, "Progressing", "InProgress"),
    ("preempted, recovering", RECOVERING, State.RECOVERING, PREEMPTED, "Progressing", "InProgress"),
    ("submission 2 runs", RECOVERING, State.RUNNING, NO_CAUSE, "Progressing", "InProgress"),
    ("succeeded, ending", SUCCEEDED_ENDING, State.SUCCEEDED, NO_CAUSE, "Progressing", "InProgress"),
    ("succeeded", SUCCEEDED, State.SUCCEEDED, NO_CAUSE, "Healthy", "Current"),
]


def test_every_view_says_the_same_state_through_a_recovery() -> None:
    bodies: list[dict[str, Any]] = []
    previous: dict[str, Any] | None = None
    for step, record, shown, cause, _, _ in LIFECYCLE:
        note = WAITING if step == "submission 1 waits" else ""
        body = written(record, shown, cause, previous, note)
        previous = body["status"]
        bodies.append(body)
        state, reason = str(shown), SHOWN_REASONS[shown]
        cause_word = "" if cause.kind is CauseKind.NONE else str(cause.kind)
        # kubectl get dj
        row = columns(body)
        assert (row["State"], row["Cause"], row["Reason"]) == (state, cause_word, reason), step
        assert row["Submission"] == str(len(record.submissions) or ""), step
        # kubectl dispatch get and describe
        mine = plugin_row(body)
        assert (mine["STATE"], mine["CAUSE"], mine["REASON"]) == (state, cause_word or "-", reason), step
        assert mine["READY"] == row["Ready"], step
        assert (described(body, "State") or "").split()[0] == state, step
        # the conditions: Ready's reason is the state; Reconciling only while something goes on
        conditions = {c["type"]: c for c in body["status"]["conditions"]}
        assert conditions["Ready"]["reason"] == reason, step
        assert conditions["Ready"]["message"].endswith(note), step  # why it waits, for Argo CD too
        assert columns(body, wide=True)["Note"] == note, step
        assert ("Reconciling" in conditions) is (not record.settled), step
    # the GitOps tools read the conditions: Argo CD's message names the same state
    argo = gitops.argocd(bodies)
    flux = gitops.kstatus(bodies)
    for (step, _, shown, _, health, verdict), a, f in zip(LIFECYCLE, argo, flux, strict=True):
        assert (a["status"], f["status"]) == (health, verdict), (step, a, f)
        assert a["message"].startswith(SHOWN_REASONS[shown]), (step, a)
    assert argo[1]["message"] == f"Pending: submission 1 authorized; {WAITING}", argo[1]


def test_a_refused_job_says_why_in_the_default_columns_and_the_plugin() -> None:
    message = "spec.kubeflow.resources.cpu: must be a CPU quantity, such as 2, 0.5 or 500m, not 'lots'"
    body = bare_job(None)
    body["status"] = refusal_write(REASON_INVALID_SPEC, message, previous=[], generation=1, now=T0)
    row = columns(body)
    assert (row["State"], row["Ready"], row["Reason"]) == ("", "False", REASON_INVALID_SPEC)
    mine = plugin_row(body)
    assert (mine["STATE"], mine["READY"], mine["REASON"]) == ("-", "False", REASON_INVALID_SPEC)
    assert (described(body, "Refused") or "").startswith(
        f"{REASON_INVALID_SPEC}: spec.kubeflow.resources.cpu"
    )
    assert described(body, "State") is None
    assert described(body, "Submitted by") is None
    (argo,) = gitops.argocd([body])
    assert (argo["status"], argo["message"]) == ("Degraded", f"{REASON_INVALID_SPEC}: {message}")


def test_a_job_waiting_for_its_backend_is_in_progress_not_failed() -> None:
    """No operator serves its backend yet (the webhook was off): it waits, and GitOps tools and
    ``kubectl wait --for=condition=Failed`` do not read it as a failure."""
    message = "backend 'slurm' is not served by this operator; nothing was created"
    body = bare_job(None)
    body["status"] = refusal_write(REASON_BACKEND_NOT_CONFIGURED, message, previous=[], generation=1, now=T0)
    conditions = {c["type"]: c["status"] for c in body["status"]["conditions"]}
    assert conditions == {"Ready": "False", "Reconciling": "True", "Succeeded": "False", "Failed": "False"}
    assert refusal(body) == REASON_BACKEND_NOT_CONFIGURED  # the loop does not write it again
    row = columns(body)
    assert (row["Ready"], row["Reason"]) == ("False", REASON_BACKEND_NOT_CONFIGURED)
    (argo,) = gitops.argocd([body])
    (flux,) = gitops.kstatus([body])
    assert (argo["status"], flux["status"]) == ("Progressing", "InProgress"), (argo, flux)
    assert message in argo["message"]


def test_wide_columns_fit_160_and_the_note_comes_last() -> None:
    """The widest row ``kubectl get dj -o wide`` prints before the note (a sentence, last): the
    longest name dispatch allows, the longest words of each column."""
    names = [c["name"] for c in printer_columns()]
    assert names[-1] == "Note"
    widest = {
        "Name": "j" * 48,
        "State": max((str(s) for s in State), key=len),
        "Submission": "99",
        "Cause": max((str(k) for k in CauseKind), key=len),
        "Ready": "False",
        "Reason": "BackendNotConfigured",
        "Age": "100d",
        "Backend": "trainjob",
    }
    cells = [max(len(n), len(widest[n])) for n in ["Name", *names[:-1]]]
    assert sum(cells) + 3 * len(cells) <= 160

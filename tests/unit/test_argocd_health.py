"""The Argo CD health check (docs/argocd/dispatchjob-health.lua) run by the Lua interpreter Argo CD
embeds (gopher-lua, hack/gitops/argocd-health), and Flux's verdict computed by kstatus
(hack/gitops/kstatus-verdict), on every status the operator writes.

The DispatchJob statuses are built by the operator's own code: records moved through the protocol
by :func:`dispatch._decide.apply`, turned into ``.status`` by :func:`dispatch._dispatchjob.record_status`
and :func:`~dispatch._dispatchjob.conditions_for`/:func:`~dispatch._dispatchjob.render_conditions`, as
:meth:`KubeRecordStore.put` writes them (and :func:`~dispatch._dispatchjob.refusal_conditions` for a
refused job). The Lua runs with only the libraries Argo CD opens by default for a custom check
(base, table, package): no string, math or io library. Real objects from the lab, in every state,
are checked by e2e/test_gitops.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from dispatch import Record, State
from tests.support import gitops
from tests.support.records import (
    AUTHORIZED,
    CANCELLED,
    FAILED,
    FAILED_ENDING,
    PENDING,
    RECOVERING,
    SUCCEEDED,
    SUCCEEDED_ENDING,
    SUSPENDED,
    dispatch_job,
)

REPO = Path(__file__).resolve().parents[2]
SCRIPT = (REPO / "docs" / "argocd" / "dispatchjob-health.lua").read_text()


def health(obj: Mapping[str, Any]) -> dict[str, str]:
    """The health script's verdict, run as Argo CD runs it (one object)."""
    (out,) = gitops.argocd([obj])
    assert out["status"] in {"Healthy", "Progressing", "Degraded", "Suspended"}, out
    return {"status": out["status"], "message": out["message"]}


def flux(obj: Mapping[str, Any]) -> str:
    """kstatus' verdict (what a Flux Kustomization's health check concludes)."""
    (out,) = gitops.kstatus([obj])
    return str(out["status"])


@pytest.mark.parametrize(
    ("record", "expected", "words", "kstatus"),
    [
        (PENDING, "Progressing", "no submission authorized yet", "InProgress"),
        (AUTHORIZED, "Progressing", "submission 1 authorized", "InProgress"),
        (RECOVERING, "Progressing", "recovering from preempted", "InProgress"),
        (SUCCEEDED_ENDING, "Progressing", "ending the job's objects", "InProgress"),
        (SUCCEEDED, "Healthy", "succeeded in submission 2", "Current"),
        (FAILED_ENDING, "Progressing", "ending the job's objects", "InProgress"),
        (FAILED, "Degraded", "out-of-memory", "Failed"),
        (CANCELLED, "Degraded", "cancelled by human:ada", "Failed"),
        (SUSPENDED, "Suspended", "suspended by human:ada", "InProgress"),
    ],
    ids=[
        "pending",
        "authorized",
        "recovering",
        "succeeded-ending",
        "succeeded",
        "failed-ending",
        "failed",
        "cancelled",
        "suspended",
    ],
)
def test_health_of_every_state_the_operator_writes(
    record: Record, expected: str, words: str, kstatus: str
) -> None:
    result = health(dispatch_job(record))
    assert result["status"] == expected, result
    assert words in result["message"], result
    assert flux(dispatch_job(record)) == kstatus


def test_the_states_are_what_the_cases_say() -> None:
    assert PENDING.state is State.PENDING
    assert not PENDING.submissions
    assert RECOVERING.state is State.RECOVERING
    assert SUCCEEDED_ENDING.state is State.SUCCEEDED
    assert not SUCCEEDED_ENDING.settled
    assert SUCCEEDED.settled
    assert FAILED.state is State.FAILED
    assert CANCELLED.state is State.CANCELLED


def test_a_refused_job_is_degraded_with_the_reason() -> None:
    body = dispatch_job(None, refused=("UnenforceableRule", "rule 0: no enforcer for node-lost"))
    assert health(body) == {
        "status": "Degraded",
        "message": "UnenforceableRule: rule 0: no enforcer for node-lost",
    }
    assert flux(body) == "Failed"


def test_no_status_yet_is_progressing_for_argo_but_current_for_kstatus() -> None:
    """kstatus takes an object without conditions or observedGeneration to be reconciled: until the
    operator's first write, Flux's default health check calls a new DispatchJob Current
    (docs/gitops.md says so and gives the healthCheckExprs that close that window)."""
    assert health(dispatch_job(None))["status"] == "Progressing"
    assert flux(dispatch_job(None)) == "Current"


def test_a_generation_the_operator_has_not_observed_is_progressing() -> None:
    """Even a succeeded (or failed) status is stale while observedGeneration < generation."""
    for record in (SUCCEEDED, FAILED):
        result = health(dispatch_job(record, generation=2, observed=1))
        assert result["status"] == "Progressing", result
        assert "generation 2" in result["message"]
        assert flux(dispatch_job(record, generation=2, observed=1)) == "InProgress"
    assert health(dispatch_job(SUCCEEDED, generation=2, observed=2))["status"] == "Healthy"


def test_without_a_status_observed_generation_the_ready_condition_says_it() -> None:
    body = dispatch_job(SUCCEEDED, generation=3)
    del body["status"]["observedGeneration"]
    assert health(body)["status"] == "Healthy"
    for c in body["status"]["conditions"]:
        c["observedGeneration"] = 2
    assert health(body)["status"] == "Progressing"


def test_a_job_being_deleted_is_progressing() -> None:
    body = dispatch_job(AUTHORIZED)
    body["metadata"]["deletionTimestamp"] = "2025-01-02T03:04:05Z"
    assert health(body)["status"] == "Progressing"
    assert flux(body) == "Terminating"


def test_suspended_is_never_returned() -> None:
    for record in (PENDING, AUTHORIZED, RECOVERING, SUCCEEDED_ENDING, SUCCEEDED, FAILED, CANCELLED):
        assert health(dispatch_job(record))["status"] != "Suspended"


def test_docs_install_the_same_script() -> None:
    """docs/gitops.md shows the argocd-cm key and embeds exactly this script."""
    gitops = (REPO / "docs" / "gitops.md").read_text()
    assert "resource.customizations.health.dispatch.dev_DispatchJob: |" in gitops
    embedded = [line.removeprefix("    ") for line in _block_after(gitops, "dispatch.dev_DispatchJob: |")]
    assert "\n".join(embedded).strip() == SCRIPT.strip()


def _block_after(text: str, marker: str) -> list[str]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().endswith(marker)) + 1
    out: list[str] = []
    for line in lines[start:]:
        if line.startswith("```"):
            break
        if line.strip() and not line.startswith("    "):
            break
        out.append(line)
    while out and not out[-1].strip():
        out.pop()
    return out

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
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from dispatch import Actor, ActorKind, Cause, CauseKind, JobSpec, Record, RecoveryPolicy, Rule, State
from dispatch._backends.kubeflow._adapter import CAPABILITIES
from dispatch._decide import Authorize, RecordCanonical, RecordOutcome, RecordSettled, Write, apply, decide
from dispatch._dispatchjob import conditions_for, record_status, refusal_conditions, render_conditions
from dispatch._model import SUPERVISOR, CancelRequest
from dispatch._plan import make_plan
from tests.support import gitops

REPO = Path(__file__).resolve().parents[2]
SCRIPT = (REPO / "docs" / "argocd" / "dispatchjob-health.lua").read_text()
T0 = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
ADA = Actor(kind=ActorKind.HUMAN, id="ada")
PREEMPTED = Cause(kind=CauseKind.PREEMPTED, detail="preempted by a higher-priority job")
OOM = Cause(kind=CauseKind.OUT_OF_MEMORY, exit_code=137)
SUCCESS = Cause(kind=CauseKind.NONE)


def health(obj: Mapping[str, Any]) -> dict[str, str]:
    """The health script's verdict, run as Argo CD runs it (one object)."""
    (out,) = gitops.argocd([obj])
    assert out["status"] in {"Healthy", "Progressing", "Degraded", "Suspended"}, out
    return {"status": out["status"], "message": out["message"]}


def flux(obj: Mapping[str, Any]) -> str:
    """kstatus' verdict (what a Flux Kustomization's health check concludes)."""
    (out,) = gitops.kstatus([obj])
    return str(out["status"])


def new_record() -> Record:
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
    body: dict[str, Any] = {
        "apiVersion": "dispatch.dev/v1alpha1",
        "kind": "DispatchJob",
        "metadata": {"name": "finetune", "namespace": "team-a", "generation": generation},
        "spec": {"backend": "kubeflow", "command": ["torchrun", "train.py"]},
    }
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


PENDING = new_record()
AUTHORIZED = step(PENDING, Authorize(1), RecordCanonical(1, "finetune-1"))
RECOVERING = step(AUTHORIZED, Authorize(2, rule=0, cause=PREEMPTED), RecordCanonical(2, "finetune-2"))
SUCCEEDED_ENDING = step(RECOVERING, RecordOutcome(State.SUCCEEDED, SUCCESS))
SUCCEEDED = step(SUCCEEDED_ENDING, RecordSettled())
FAILED_ENDING = step(AUTHORIZED, RecordOutcome(State.FAILED, OOM))
FAILED = step(FAILED_ENDING, RecordSettled())
_CANCEL_ASKED = AUTHORIZED.model_copy(update={"cancel": CancelRequest(actor=ADA, time=T0)})
_CANCEL_STEP = decide(_CANCEL_ASKED, []).step  # what the supervisor really writes for a cancel
assert isinstance(_CANCEL_STEP, RecordOutcome)
CANCELLED = step(_CANCEL_ASKED, _CANCEL_STEP, RecordSettled())


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

"""The workload kit's own pieces, without a cluster: a plan's refusal of a restart rule nobody
enforces, one state object per tracked object, and the per-kind protocol every kind satisfies."""

from __future__ import annotations

from typing import Any, Final

import pytest

from dispatch._backends.job import CAPABILITIES as JOB_CAPABILITIES
from dispatch._backends.job._adapter import JOB
from dispatch._backends.kubeflow import CAPABILITIES as KUBEFLOW
from dispatch._backends.kubeflow._kind import PYTORCHJOB
from dispatch._errors import PlanError
from dispatch._kubeclient import Packed
from dispatch._model import (
    Action,
    Capabilities,
    CauseKind,
    JobSpec,
    ObjectView,
    Phase,
    RecoveryPolicy,
    Rule,
)
from dispatch._plan import make_plan
from dispatch._workload import Kind, classify
from dispatch._workload._tracked import Tracked as _Tracked
from dispatch._workload._tracked import kept_view

RULES = [
    (),
    (Rule(on=(CauseKind.PREEMPTED,), budget=2),),
    (Rule(on=(CauseKind.PREEMPTED, CauseKind.NODE_LOST), budget=0),),
    (
        Rule(on=(CauseKind.NON_ZERO_EXIT, CauseKind.OUT_OF_MEMORY), action=Action.RESTART, budget=2),
        Rule(on=(CauseKind.PREEMPTED,), budget=1),
    ),
]


def test_a_restart_rule_is_refused_where_no_scheduler_enforces_it() -> None:
    spec = JobSpec(name="a", command=("x",), recovery=RecoveryPolicy(rules=RULES[3]))
    with pytest.raises(PlanError):
        make_plan("ns/a", spec, Capabilities(), supervised=True)


def test_our_own_write_shows_until_the_watch_brings_it_or_something_newer() -> None:
    state = _Tracked()
    ours = Packed({"metadata": {"resourceVersion": "12"}, "spec": {"mine": True}})
    state.overlay = ours
    assert state.current() is ours
    state.body = Packed({"metadata": {"resourceVersion": "11"}})
    assert state.current() is ours  # the watch lags our write
    newer = Packed({"metadata": {"resourceVersion": "13"}})
    state.body = newer
    assert state.current() is newer


def test_a_forgotten_object_keeps_only_its_running_pods() -> None:
    state = _Tracked(job="ns/a", body=Packed({"metadata": {}}), ended_by_us=True, restarts=3)
    state.pods["ns/a-1-x"] = Packed({"status": {"phase": "Running"}})
    left = state.forgotten()
    assert left.pods == state.pods
    assert (left.body, left.overlay, left.ended_by_us, left.restarts, left.stop) == (
        None,
        None,
        False,
        0,
        None,
    )


@pytest.mark.parametrize("kind", [PYTORCHJOB, JOB], ids=lambda k: k.name)
def test_every_kind_satisfies_the_protocol_and_declares_its_capabilities(kind: Kind) -> None:
    assert isinstance(kind, Kind)
    # Native rules only: whether Kueue can queue it is the backend's to say (the cluster may lack Kueue).
    assert kind.capabilities.native == {"kubeflow": KUBEFLOW, "job": JOB_CAPABILITIES}[kind.name].native
    held = {"spec": {}, "metadata": {"name": "a-1"}}
    held.update(kind.suspend_patch(True))
    assert kind.suspended(held)
    released = {"spec": {}, "metadata": {"name": "a-1"}}
    released.update(kind.suspend_patch(False))
    assert not kind.suspended(released)
    assert kind.outcome(released, None) is None
    assert all(p.startswith("a-1-") for p in kind.pod_prefixes(released))


def _pytorchjob(restart_policy: str, budget: int | None) -> dict[str, Any]:
    annotations = {"dispatch.dev/restart-budget": str(budget)} if budget is not None else {}
    return {
        "metadata": {
            "name": "a-1",
            "namespace": "ns",
            "resourceVersion": "5",
            "labels": {"dispatch.dev/job": "a", "dispatch.dev/submission": "1"},
            "annotations": annotations,
        },
        "spec": {"runPolicy": {}, "pytorchReplicaSpecs": {"Master": {"restartPolicy": restart_policy}}},
        "status": {},
    }


RESTARTED_POD: Final = {
    "metadata": {"name": "a-1-master-0", "uid": "u1"},
    "spec": {"nodeName": "n"},
    "status": {
        "phase": "Running",
        "containerStatuses": [
            {
                "name": "pytorch",
                "restartCount": 1,
                "state": {"running": {}},
                "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}},
            }
        ],
    },
}


def test_a_kubelet_restart_is_a_restart_under_the_rule_and_an_end_without_it() -> None:
    """The same pod (its container exited 1 and the kubelet started it again): built with the native
    rule (OnFailure) it is one restart and the object runs on; built without one, nobody asked for
    that restart: the object ended non-zero-exit and the kit stops it."""
    with_rule = classify(PYTORCHJOB, _pytorchjob("OnFailure", 2), [RESTARTED_POD], now=0.0)
    assert (with_rule.view.phase, with_rule.view.restarts, with_rule.stop) == (Phase.RUNNING, 1, None)
    without = classify(PYTORCHJOB, _pytorchjob("Never", None), [RESTARTED_POD], now=0.0)
    assert without.view.phase is Phase.ENDED
    assert without.stop is not None
    assert without.stop.kind is CauseKind.NON_ZERO_EXIT
    assert without.stop.exit_code == 1


def test_a_kept_view_shares_its_fields_set_and_reads_the_same() -> None:
    """The kit's cache keeps each object's view with one shared ``model_fields_set`` per
    combination of fields; what anyone reads of the view, or of a copy made from it, is unchanged."""

    def view(i: int) -> ObjectView:
        return ObjectView(id=f"ns/a-{i}", job=f"ns/a{i}", submission=1, phase=Phase.RUNNING, restarts=i)

    fresh = [view(i) for i in range(2)]
    kept = [kept_view(view(i)) for i in range(2)]
    assert kept == fresh
    assert kept[0].model_fields_set is kept[1].model_fields_set
    assert kept[0].model_fields_set == fresh[0].model_fields_set
    copied = kept[0].model_copy(update={"terminating": True})
    assert copied.terminating
    assert "terminating" not in kept[1].model_fields_set  # the copy added to its own set
    other = kept_view(ObjectView(id="ns/b-1", job="ns/b", submission=1, phase=Phase.ENDED))
    assert other.model_fields_set is not kept[0].model_fields_set

"""tests/support/lab.py's ``preempt_pod``: a preemptor that kube-scheduler binds beside its victim
(its cache did not have the victim's new label yet, so the anti-affinity could not hold; seen once
in CI) is deleted and made again, instead of waiting out the timeout for a preemption that never
comes.

The real kube-scheduler cannot be made to schedule from a stale cache on request, so the API here
is a script (named in docs/testing.md): pods in a dict, the first preemptor bound beside the
victim, the second one preempting it as kube-scheduler does (DisruptionTarget on the victim, which
then goes, before the preemptor is bound).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from tests.support.lab import PREEMPT_ATTEMPTS, ApiStatus, Lab, LabError

NS, VICTIM, NODE = "team", "train-1-master-0", "kwok-node-2"


class ScriptedLab(Lab):
    """Only what ``preempt_pod`` asks of the API server; ``beside`` preemptors are bound beside
    the victim before one preempts it."""

    def __init__(self, beside: int) -> None:  # no control plane: nothing of Lab.__init__ is used
        self.beside = beside
        self.created: list[str] = []
        self.deleted: list[str] = []
        self.objects: dict[str, dict[str, Any]] = {
            VICTIM: {
                "metadata": {"name": VICTIM, "uid": "victim-uid", "labels": {}},
                "spec": {"nodeName": NODE, "containers": [{"resources": {"requests": {"cpu": "1"}}}]},
                "status": {"phase": "Running"},
            }
        }

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        query: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        name = path.rsplit("/", 1)[-1]
        if method == "GET" and path.startswith("/api/v1/nodes/"):
            return {"metadata": {"name": name}, "status": {"allocatable": {"cpu": "8"}}}
        if method == "GET":
            if name not in self.objects:
                raise ApiStatus(404, "not found")
            return self.objects[name]
        if method == "PATCH":
            self.objects[name]["metadata"]["labels"].update(body["metadata"]["labels"])
            return self.objects[name]
        if method == "POST":
            pod = {**body, "metadata": dict(body["metadata"])}
            preemptor = pod["metadata"]["name"]
            self.created.append(preemptor)
            if len(self.created) > self.beside:  # kube-scheduler preempts: the victim says why and goes
                self.objects.pop(VICTIM, None)
            pod["spec"] = {**pod["spec"], "nodeName": NODE}
            self.objects[preemptor] = pod
            return pod
        if method == "DELETE":
            self.deleted.append(name)
            self.objects.pop(name, None)
            return {}
        raise AssertionError(f"unexpected {method} {path}")


def test_a_preemptor_bound_beside_its_victim_is_made_again() -> None:
    lab = ScriptedLab(beside=1)
    preemptor = lab.preempt_pod(NS, VICTIM, timeout=5)
    assert lab.created == [f"{preemptor[:-2]}-1", preemptor]
    assert preemptor.endswith("-2")
    assert lab.deleted == [lab.created[0], preemptor]  # the one beside it, then the one that preempted
    assert VICTIM not in lab.objects


def test_preemptors_bound_beside_it_every_time_fail_with_why() -> None:
    lab = ScriptedLab(beside=PREEMPT_ATTEMPTS)
    why = f"{PREEMPT_ATTEMPTS} preemptors of team/{VICTIM} were bound beside it"
    with pytest.raises(LabError, match=why):
        lab.preempt_pod(NS, VICTIM, timeout=5)
    assert lab.deleted == lab.created

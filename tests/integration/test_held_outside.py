"""Never undo someone else's suspension, on the lab's real training operator.

A released PyTorchJob that another controller suspends (as Kueue does when it evicts a workload;
here a user with ``kubectl patch`` and a field manager of its own) is held outside dispatch: the
operator never releases it again, status and an Event say who holds it (``status.observedNote``,
reason ``HeldOutside``), and when the other controller resumes it the run goes on to its end as if
nothing had happened.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest

from tests.integration.conftest import (
    OperatorProcess,
    apply,
    await_for,
    dispatch_job,
    get_job,
    pytorchjobs,
    running_pj,
    settled,
)
from tests.support.kube import KubeCluster
from tests.support.lab import Kubeflow, Lab

pytestmark = pytest.mark.integration

HOLDER = "kueue-like-controller"


def suspend(cluster: KubeCluster, namespace: str, name: str, value: bool) -> None:
    patch = json.dumps({"spec": {"runPolicy": {"suspend": value}}})
    cluster.kubectl(
        "patch", "pytorchjob", name, "-n", namespace, "--type=merge", f"--field-manager={HOLDER}", "-p", patch
    )


def dispatch_writes(writes: list[dict[str, Any]], name: str) -> list[tuple[str, str | None]]:
    """(verb, subresource) of the writes dispatch's operator made to the object ``name``."""
    return [
        (e["verb"], e.get("objectRef", {}).get("subresource"))
        for e in writes
        if e.get("objectRef", {}).get("name") == name and str(e.get("userAgent", "")).startswith("dispatch")
    ]


def pj(cluster: KubeCluster, namespace: str, name: str) -> dict[str, Any]:
    return next(p for p in pytorchjobs(cluster, namespace) if p["metadata"]["name"] == name)


async def test_a_released_object_suspended_by_another_controller_is_never_released_again(
    crds: KubeCluster,
    namespace: str,
    operator: Callable[..., OperatorProcess],
    kubeflow: Kubeflow,
    lab: Lab,
) -> None:
    start = lab.audit_mark()
    operator()
    await asyncio.to_thread(apply, crds, namespace, dispatch_job("held", nodes=1))
    name = await running_pj(crds, namespace, "held", 1, kubeflow)
    assert "dispatch.dev/released" in pj(crds, namespace, name)["metadata"]["annotations"]
    mark = lab.audit_mark()
    await asyncio.to_thread(suspend, crds, namespace, name, True)

    def noted() -> str | None:
        note = (get_job(crds, namespace, "held").get("status") or {}).get("observedNote")
        return str(note) if note else None

    note = await await_for("status to say who holds it", noted)
    assert HOLDER in note, note

    def held_events() -> list[dict[str, Any]]:
        items = json.loads(crds.kubectl("get", "events", "-n", namespace, "-o", "json"))["items"]
        return [
            e for e in items if e.get("reason") == "HeldOutside" and e["involvedObject"]["name"] == "held"
        ]

    events = await await_for("an Event to say who holds it", held_events)
    assert len(events) == 1, events
    assert events[0]["type"] == "Warning"
    assert HOLDER in events[0]["message"], events
    # The training operator deletes a suspended job's pods; dispatch writes nothing to the object.
    await await_for(
        f"{name}'s pods gone", lambda: not lab.pods(namespace, f"training.kubeflow.org/job-name={name}")
    )
    await asyncio.sleep(3)  # time for a wrong release to land
    assert pj(crds, namespace, name)["spec"]["runPolicy"]["suspend"] is True
    writes = await asyncio.to_thread(lab.audit_writes, mark, namespace=namespace, resource="pytorchjobs")
    assert dispatch_writes(writes, name) == [], "dispatch wrote to the object someone else holds"
    before = await asyncio.to_thread(lab.audit_writes, start, namespace=namespace, resource="pytorchjobs")
    assert ("patch", None) in dispatch_writes(before, name)  # its release: the filter sees dispatch
    body = await asyncio.to_thread(get_job, crds, namespace, "held")
    assert body["status"]["observedState"] == "pending"
    assert [s["n"] for s in body["status"]["submissions"]] == [1]  # no resubmission: nothing failed
    # Resumed by its holder: the same object runs on, and the job ends as the run does.
    await asyncio.to_thread(suspend, crds, namespace, name, False)
    await kubeflow.succeed(namespace, name)
    done = await settled(crds, namespace, "held")
    assert done["status"]["state"] == "succeeded"
    assert [s["n"] for s in done["status"]["submissions"]] == [1]
    assert "observedNote" not in done["status"]

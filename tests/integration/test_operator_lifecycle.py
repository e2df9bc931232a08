"""The operator on the real control plane, driven as a user drives it: ``kubectl apply`` of manifests.

The operator runs as a process (``python -m dispatch._controller``) on the lab: Kubeflow's real training
operator makes the pods, kube-scheduler binds and preempts them, kwok plays their kubelet.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest

from tests.integration.conftest import (
    OperatorProcess,
    ReleaseMonitor,
    apply,
    await_for,
    condition,
    dispatch_job,
    get_job,
    history,
    pj_conditions,
    pytorchjobs,
    released_pj,
)
from tests.support.builders import SEED_HISTORY
from tests.support.kube import KubeCluster
from tests.support.lab import Kubeflow

pytestmark = pytest.mark.integration


# ---- refused by the API server ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"nodes": 0}, "spec.nodes", "greater than or equal to 1"),
        ({"nodes": 5000}, "spec.nodes", "less than or equal to 1024"),
        ({"recovery": {"rules": [{"on": ["bogus"], "budget": 1}]}}, "spec.recovery.rules[0].on[0]", "bogus"),
        ({"recovery": {"rules": [{"on": ["none"], "budget": 1}]}}, "spec.recovery.rules[0].on[0]", "none"),
        (
            {"recovery": {"rules": [{"on": ["preempted"], "budget": 101}]}},
            "spec.recovery.rules[0].budget",
            "100",
        ),
        (
            {"recovery": {"rules": [{"on": ["preempted"], "budget": 1}, {"on": ["preempted"], "budget": 2}]}},
            "spec.recovery.rules",
            "at most one rule",
        ),
        ({"backend": "lsf"}, "spec.backend", "lsf"),
        ({"kubeflow": None}, "spec.kubeflow", "required when backend is kubeflow"),
        ({"command": []}, "spec.command", "at least 1"),
    ],
)
def test_invalid_manifest_is_rejected_naming_the_field(
    crds: KubeCluster, namespace: str, change: dict[str, Any], field: str, words: str
) -> None:
    manifest = dispatch_job("bad", extra_spec=change)
    proc = apply(crds, namespace, manifest, check=False)
    assert proc.returncode != 0, proc.stdout
    assert field in proc.stderr, proc.stderr
    assert words in proc.stderr, proc.stderr


def test_spec_is_immutable_except_cancel(crds: KubeCluster, namespace: str) -> None:
    apply(crds, namespace, dispatch_job("fixed"))
    proc = apply(crds, namespace, dispatch_job("fixed", nodes=3), check=False)
    assert proc.returncode != 0
    assert "spec.nodes" in proc.stderr, proc.stderr
    assert "immutable" in proc.stderr, proc.stderr
    proc = apply(
        crds, namespace, dispatch_job("fixed", rules=[{"on": ["preempted"], "budget": 3}]), check=False
    )
    assert "spec.recovery" in proc.stderr, proc.stderr
    assert "immutable" in proc.stderr, proc.stderr
    # cancel is the one field that may change, from false to true only
    apply(crds, namespace, dispatch_job("fixed", extra_spec={"cancel": True}))
    proc = apply(crds, namespace, dispatch_job("fixed", extra_spec={"cancel": False}), check=False)
    assert "spec.cancel" in proc.stderr, proc.stderr
    assert "cannot be undone" in proc.stderr, proc.stderr


def test_long_name_is_rejected(crds: KubeCluster, namespace: str) -> None:
    proc = apply(crds, namespace, dispatch_job("x" * 49), check=False)
    assert proc.returncode != 0
    assert "metadata.name" in proc.stderr, proc.stderr
    assert "48" in proc.stderr, proc.stderr


# ---- refused by the operator ----------------------------------------------------------------------


async def test_unenforceable_rule_stalls_the_job_and_creates_nothing(
    crds: KubeCluster, namespace: str, operator: Callable[..., OperatorProcess]
) -> None:
    operator()
    rules = [{"on": ["preempted"], "budget": 3}, {"on": ["node-lost"], "action": "restart", "budget": 1}]
    await asyncio.to_thread(apply, crds, namespace, dispatch_job("nobody", rules=rules))

    def stalled() -> dict[str, Any] | None:
        return condition(get_job(crds, namespace, "nobody"), "Stalled")

    stall = await await_for("Stalled", stalled)
    body = await asyncio.to_thread(get_job, crds, namespace, "nobody")
    ready = condition(body, "Ready")
    assert stall["status"] == "True"
    assert stall["reason"] == "UnenforceableRule"
    assert ready is not None
    assert ready["status"] == "False"
    assert ready["reason"] == "UnenforceableRule"
    assert "rules[1]" in ready["message"], ready["message"]
    assert "restart" in ready["message"], ready["message"]
    assert "plan" not in body["status"]
    assert "submissions" not in body["status"]
    assert body["status"]["observedGeneration"] == body["metadata"]["generation"]
    assert await asyncio.to_thread(pytorchjobs, crds, namespace) == []
    # kubectl wait sees the refusal as a failure
    await asyncio.to_thread(
        crds.kubectl, "wait", "-n", namespace, "dispatchjob/nobody", "--for=condition=Failed", "--timeout=30s"
    )


# ---- the seed's scenario through kubectl apply -----------------------------------------------------


async def test_preemption_is_recovered_with_the_seed_history(
    crds: KubeCluster,
    namespace: str,
    operator: Callable[..., OperatorProcess],
    kubeflow: Kubeflow,
    release_monitor: ReleaseMonitor,
) -> None:
    operator()
    await asyncio.to_thread(apply, crds, namespace, dispatch_job("finetune"))

    first = await released_pj(crds, namespace, 1)
    name1 = first["metadata"]["name"]
    body = await asyncio.to_thread(get_job, crds, namespace, "finetune")
    assert body["status"]["submissions"][0]["canonical"] == f"{namespace}/{name1}"
    # built as the issue says: Master + Workers for nodes, container "pytorch", tagged, owned
    replicas = first["spec"]["pytorchReplicaSpecs"]
    assert replicas["Master"]["replicas"] == 1
    assert replicas["Worker"]["replicas"] == 1
    container = replicas["Master"]["template"]["spec"]["containers"][0]
    assert container["name"] == "pytorch"
    assert container["image"] == "pytorch/pytorch:2.4"
    assert first["metadata"]["labels"]["dispatch.dev/job"]
    assert first["metadata"]["ownerReferences"][0]["kind"] == "DispatchJob"
    await asyncio.wait_for(kubeflow.wait_pods(namespace, name1, 2), 60)
    await await_for(
        "running", lambda: pj_conditions(pytorchjobs(crds, namespace)[0]).get("Running") == "True"
    )

    await kubeflow.preempt(namespace, name1)
    second = await released_pj(crds, namespace, 2)
    name2 = second["metadata"]["name"]
    await asyncio.wait_for(kubeflow.wait_pods(namespace, name2, 2), 60)
    await kubeflow.succeed(namespace, name2)

    await asyncio.to_thread(
        crds.kubectl,
        "wait",
        "-n",
        namespace,
        "dispatchjob/finetune",
        "--for=condition=Succeeded",
        "--timeout=90s",
    )
    await await_for("settled", lambda: get_job(crds, namespace, "finetune")["status"].get("settled"))
    body = await asyncio.to_thread(get_job, crds, namespace, "finetune")
    status = body["status"]
    assert history(body) == SEED_HISTORY
    assert status["state"] == "succeeded"
    assert [s["n"] for s in status["submissions"]] == [1, 2]
    assert status["submissions"][0]["cause"]["kind"] == "preempted"
    assert status["plan"]["rules"][0]["firings"] == 1
    assert status["plan"]["rules"][0]["enforcer"] == "supervisor"
    assert all(h["actor"] == {"kind": "supervisor", "id": "supervisor"} for h in status["history"])
    assert condition(body, "Ready")["status"] == "True"  # type: ignore[index]
    assert condition(body, "Reconciling") is None
    assert condition(body, "Stalled") is None
    names = sorted(pj["metadata"]["name"] for pj in await asyncio.to_thread(pytorchjobs, crds, namespace))
    assert len(names) <= 2
    job = "finetune"  # the label holds the DispatchJob's name (a label value has no "/")
    assert release_monitor.max_live.get(job, 0) == 1
    assert release_monitor.released[job] == {name1, name2}
    printed = await asyncio.to_thread(crds.kubectl, "get", "dj", "-n", namespace, "finetune", "-o", "json")
    assert json.loads(printed)["status"]["state"] == "succeeded"

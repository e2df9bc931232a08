"""``kubectl dispatch preempt`` and ``lose-node`` on the lab: a failure made the way the cluster
makes it (the Eviction API; a NoExecute taint and kube-controller-manager's taint eviction), read
by the operator from what Kubernetes wrote, and recovered by the job's rule."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from dispatch._cli._inject import NODE_LOSS_TAINT
from tests.integration.conftest import OperatorProcess, apply, get_job
from tests.support.builders import lab_manifest
from tests.support.kube import KubeCluster
from tests.support.lab import Kubeflow

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent
RULES = [{"on": ["preempted", "node-lost"], "action": "resubmit", "budget": 2}]


def kubectl_dispatch(cluster: KubeCluster, *args: str) -> str:
    """``kubectl dispatch ARGS``, as a user runs it: kubectl finds the plugin on PATH."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    env["KUBECONFIG"] = str(cluster.kubeconfig)
    proc = subprocess.run(
        [cluster.kubectl_bin, "dispatch", *args],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize(("command", "cause"), [("preempt", "preempted"), ("lose-node", "node-lost")])
async def test_a_failure_injected_by_the_plugin_is_recovered_by_the_rule(
    crds: KubeCluster,
    namespace: str,
    operator: Callable[..., OperatorProcess],
    kubeflow: Kubeflow,
    command: str,
    cause: str,
) -> None:
    operator("--backend", "job")
    await asyncio.to_thread(apply, crds, namespace, lab_manifest("job", "tried", RULES))
    (pod,) = await asyncio.wait_for(kubeflow.wait_workload_pods(namespace, "tried", 1), 60)
    node = crds.get("pod", pod, namespace)["spec"]["nodeName"]

    said = await asyncio.to_thread(kubectl_dispatch, crds, command, "tried", "-n", namespace)
    assert f"dispatch records the submission {cause}" in said, said

    await asyncio.wait_for(kubeflow.wait_workload_pods(namespace, "tried", 2), 60)
    status = get_job(crds, namespace, "tried")["status"]
    assert status["submissions"][0]["cause"]["kind"] == cause
    assert status["plan"]["rules"][0]["firings"] == 1
    taints = crds.get("node", node)["spec"].get("taints") or []
    assert NODE_LOSS_TAINT not in {t["key"] for t in taints}  # the node takes pods again


def test_nothing_running_is_said_plainly(crds: KubeCluster, namespace: str) -> None:
    apply(crds, namespace, lab_manifest("job", "idle", RULES))  # no operator: nothing runs
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    env["KUBECONFIG"] = str(crds.kubeconfig)
    proc = subprocess.run(
        [crds.kubectl_bin, "dispatch", "preempt", "idle", "-n", namespace],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert proc.returncode == 1
    assert f"DispatchJob {namespace}/idle has no pod running on a node" in proc.stderr

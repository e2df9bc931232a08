"""What recovery cost, after real recoveries through the operator: a Kubernetes Job (the workload
kit's template kind) preempted by kube-scheduler on the lab, and a Slurm job preempted by a
higher-priority one on the real Slurm lab. The DispatchJob's ``status.cost`` holds the failure, its
node- and GPU-seconds and the time until the next submission ran; each submission's start is in
the record; the metrics count the recovery once, and a restarted operator does not count it again.
Run: ``.venv/bin/pytest -m integration tests/integration/test_recovery_cost.py``.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.conftest import OperatorProcess, apply, await_for, free_port, get_job, settled
from tests.support.builders import PREEMPTED_ONCE, lab_manifest, manifest
from tests.support.kube import KubeCluster
from tests.support.lab import Kubeflow
from tests.support.operator_probe import samples, scrape
from tests.support.slurmlab import SlurmLab

pytestmark = pytest.mark.integration

NAME = "costly"


def describe(cluster: KubeCluster, namespace: str) -> str:
    """``kubectl dispatch describe``, the plugin as installed beside this Python."""
    plugin = Path(sys.executable).parent / "kubectl-dispatch"
    args = [str(plugin), "describe", "-n", namespace, NAME, f"--kubeconfig={cluster.kubeconfig}"]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def metrics_of(port: int) -> str:
    return scrape(f"http://127.0.0.1:{port}/metrics")


async def counted(port: int, labels: dict[str, str]) -> str:
    """The metrics once they count one recovery of ``labels`` (the loop counts it right after the
    decision whose write shows the next submission running)."""

    def probe() -> str | None:
        text = metrics_of(port)
        return text if samples(text, "dispatch_recovery_seconds_count", **labels) == 1.0 else None

    found: str = await await_for("the recovery counted", probe)
    return found


def running(cluster: KubeCluster, namespace: str, n: int) -> Callable[[], dict[str, Any] | None]:
    """A probe: the DispatchJob once submission ``n`` shows running."""

    def probe() -> dict[str, Any] | None:
        body = get_job(cluster, namespace, NAME)
        status = body.get("status") or {}
        subs = status.get("submissions") or ()
        if subs and subs[-1]["n"] == n and status.get("observedState") == "running":
            return body
        return None

    return probe


def assert_one_recovery(status: dict[str, Any], *, gpus: int) -> dict[str, Any]:
    """``status.cost`` after one preemption recovered: what the record's own times say."""
    cost: dict[str, Any] = status["cost"]
    (preempted,) = cost["causes"]
    assert preempted["cause"] == "preempted"
    assert (cost["failures"], cost["recovered"], preempted["failures"], preempted["recovered"]) == (
        1,
        1,
        1,
        1,
    )
    first = status["submissions"][0]
    assert first["startedAt"], "the start of submission 1 is recorded with its end"
    assert cost["nodeSeconds"] > 0
    assert cost["gpuSeconds"] == pytest.approx(
        cost["nodeSeconds"] * gpus, abs=0.001 * max(gpus, 1)
    )  # each to the ms
    assert cost["recoverySeconds"] >= 0
    assert preempted["nodeSeconds"] == cost["nodeSeconds"]
    return cost


async def test_a_preempted_job_says_what_its_recovery_cost(
    crds: KubeCluster,
    namespace: str,
    operator: Callable[..., OperatorProcess],
    kubeflow: Kubeflow,
) -> None:
    port = free_port()
    op = operator("--backend", "job", f"--metrics-port={port}", "--metrics-addr=127.0.0.1")
    job = lab_manifest(
        "job", NAME, PREEMPTED_ONCE, options={"resources": {"cpu": "1", "memory": "1Gi", "gpu": 2}}
    )
    await asyncio.to_thread(apply, crds, namespace, job)
    await await_for("submission 1 running", running(crds, namespace, 1))
    (pod,) = await asyncio.wait_for(kubeflow.wait_workload_pods(namespace, NAME, 1), 60)
    await asyncio.sleep(1.5)  # it runs for a while: its node-seconds are more than nothing
    await kubeflow.preempt_pod(namespace, pod)
    body = await await_for("submission 2 running", running(crds, namespace, 2))

    # The recovery is over once submission 2 runs: status and metrics say so before it ends.
    cost = assert_one_recovery(body["status"], gpus=2)
    labels = {"cause": "preempted", "backend": "job", "namespace": namespace}
    text = await counted(port, labels)
    assert samples(text, "dispatch_recovery_seconds_sum", **labels) == pytest.approx(
        cost["recoverySeconds"], abs=0.001
    )
    assert samples(text, "dispatch_failed_node_seconds_total", **labels) == pytest.approx(
        cost["nodeSeconds"], abs=0.001
    )
    assert samples(text, "dispatch_failed_gpu_seconds_total", **labels) == pytest.approx(
        cost["gpuSeconds"], abs=0.002
    )

    # A restarted operator (counters from zero) sees the recovery done and counts it not again.
    op.stop()
    op.start()
    (second,) = await asyncio.wait_for(kubeflow.wait_workload_pods(namespace, NAME, 2), 60)
    await kubeflow.exit_pod(namespace, second, 0, container="main")
    body = await settled(crds, namespace, NAME)
    status = body["status"]
    assert status["state"] == "succeeded"
    assert status["submissions"][1]["startedAt"]
    assert assert_one_recovery(status, gpus=2) == cost  # the success changes nothing of it
    text = await asyncio.to_thread(metrics_of, port)
    assert samples(text, "dispatch_recovery_seconds_count", **labels) == 0.0
    assert samples(text, "dispatch_failed_node_seconds_total", **labels) == 0.0

    described = await asyncio.to_thread(describe, crds, namespace)
    assert "Recovery cost:" in described
    assert "preempted" in described.split("Recovery cost:")[1]


@pytest.mark.slurm
async def test_a_job_preempted_on_slurm_says_what_its_recovery_cost(
    crds: KubeCluster,
    namespace: str,
    operator: Callable[..., OperatorProcess],
    slurm: SlurmLab,
    tmp_path: Path,
) -> None:
    config = tmp_path / "slurm.yaml"
    config.write_text(yaml.safe_dump(slurm.backend_config(poll_interval=1.0)))
    port = free_port()
    operator(f"--slurm-config={config}", f"--metrics-port={port}", "--metrics-addr=127.0.0.1")
    job = manifest(
        NAME,
        backend="slurm",
        command=["bash", "-c", "sleep 6"],
        nodes=1,
        backend_options={"partition": "lowcxl", "cpusPerTask": 2},
        recovery={"rules": PREEMPTED_ONCE},
    )
    await asyncio.to_thread(apply, crds, namespace, job)
    await await_for("submission 1 running", running(crds, namespace, 1))
    await asyncio.sleep(2)  # Slurm's times are whole seconds: it runs for more than one
    await asyncio.to_thread(slurm.submit_blocker, "high", 2, 3)  # preempts submission 1
    body = await await_for("submission 2 running", running(crds, namespace, 2))
    cost = assert_one_recovery(body["status"], gpus=0)
    labels = {"cause": "preempted", "backend": "slurm", "namespace": namespace}
    text = await counted(port, labels)
    assert samples(text, "dispatch_failed_node_seconds_total", **labels) == pytest.approx(
        cost["nodeSeconds"], abs=0.001
    )

    status = (await settled(crds, namespace, NAME))["status"]
    assert status["state"] == "succeeded"
    assert status["submissions"][1]["startedAt"]
    assert assert_one_recovery(status, gpus=0) == cost

"""The operator across a restart of the API server (a control plane's upgrade), on a lab of its own:
the real kube-apiserver stopped and started again on the same etcd while jobs run. Every watch
breaks and lists again; the operator must write nothing about jobs that did not change, and go on
supervising: a preemption after the restart is recovered as the job's rules say.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import (
    OperatorProcess,
    apply,
    await_for,
    dispatch_job,
    free_port,
    install_crds,
)
from tests.support.kube import KubeCluster, lab_cluster
from tests.support.lab import Kubeflow
from tests.support.operator_probe import samples, scrape

pytestmark = pytest.mark.integration

JOBS = ("steady", "preempted")
NAMESPACE = "restart"
WRITES = ("create", "update", "patch", "delete")


@pytest.fixture
def own_lab(tmp_path: Path) -> Iterator[KubeCluster]:
    """A lab for this test alone (the session's is shared by every other test): its API server is
    restarted here."""
    with lab_cluster(tmp_path, nodes=2) as cluster:
        install_crds(cluster)
        cluster.kubectl("create", "namespace", NAMESPACE)
        yield cluster


async def test_the_operator_goes_on_across_a_restart_of_the_api_server(
    own_lab: KubeCluster, tmp_path: Path
) -> None:
    cluster, lab = own_lab, own_lab.lab
    assert lab is not None
    assert lab.cp.binaries is not None
    port = free_port()
    op = OperatorProcess(
        kubeconfig=cluster.kubeconfig,
        namespace=NAMESPACE,
        log_path=tmp_path / "operator.log",
        args=(f"--metrics-port={port}", "--metrics-addr=127.0.0.1"),
    ).start()
    try:
        for job in JOBS:
            await asyncio.to_thread(apply, cluster, NAMESPACE, dispatch_job(job, nodes=1))

        def observed(job: str) -> tuple[str | None, int]:
            status = cluster.get("dispatchjob", job, NAMESPACE).get("status") or {}
            return status.get("observedState"), len(status.get("submissions") or [])

        def all_running() -> bool:
            return all(observed(job) == ("running", 1) for job in JOBS)

        await await_for("every job running", all_running)

        async def state() -> tuple[dict[str, str], dict[str, float]]:
            versions = {
                job: str(cluster.get("dispatchjob", job, NAMESPACE)["metadata"]["resourceVersion"])
                for job in JOBS
            }
            metrics = await asyncio.to_thread(scrape, f"http://127.0.0.1:{port}/metrics")
            writes = {verb: samples(metrics, "dispatch_api_requests_total", verb=verb) for verb in WRITES}
            return versions, writes

        before = await state()
        listed = op.log().count(f"dispatchjobs in {NAMESPACE}: 2 listed")
        pid = lab.cp.pids["kube-apiserver"]
        await asyncio.to_thread(lab.cp.replace_apiserver, lab.cp.binaries.kube_apiserver)
        assert lab.cp.pids["kube-apiserver"] != pid

        def listed_again() -> bool:
            return op.log().count(f"dispatchjobs in {NAMESPACE}: 2 listed") > listed

        await await_for("the operator's DispatchJob watch listed again", listed_again)
        await asyncio.sleep(3)  # what a restart would make it write, it would have written by now
        assert op.running, op.log()[-3000:]
        assert await state() == before, "the operator wrote across the API server's restart"

        kubeflow = Kubeflow(lab)
        try:
            (victim,) = await asyncio.wait_for(kubeflow.wait_workload_pods(NAMESPACE, "preempted", 1), 60)
            await kubeflow.preempt_pod(NAMESPACE, victim)
        finally:
            kubeflow.restore()

        def recovered() -> bool:
            return observed("preempted") == ("running", 2)

        await await_for("the preempted job running its second submission", recovered)
        status = cluster.get("dispatchjob", "preempted", NAMESPACE)["status"]
        assert status["submissions"][0]["cause"]["kind"] == "preempted"
        assert observed("steady") == ("running", 1)
    finally:
        op.stop()

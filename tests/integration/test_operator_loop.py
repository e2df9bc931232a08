"""The operator's one supervision loop (dispatch._controller.loop): after a restart with running jobs,
every job is known and decided (the log line the scale benchmark reads), and nothing is written:
an unchanged observed field is not written again, no object is touched. Counted by the operator's
own metrics: the API server drops a no-op update without a new resourceVersion, so the objects'
versions alone would not show such a write."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any

import pytest

from tests.integration.conftest import (
    OperatorProcess,
    apply,
    await_for,
    dispatch_job,
    free_port,
    get_job,
    pytorchjobs,
)
from tests.support.kube import KubeCluster
from tests.support.operator_probe import holder, samples, scrape

pytestmark = pytest.mark.integration

JOBS = [f"steady-{i}" for i in range(3)]
DECIDED = re.compile(r"all (\d+) jobs known and decided in [0-9.]+s")


def versions(cluster: KubeCluster, namespace: str) -> dict[str, str]:
    """The resourceVersion of every DispatchJob and PyTorchJob of the namespace (a write changes it)."""
    found = {f"dj/{j}": str(get_job(cluster, namespace, j)["metadata"]["resourceVersion"]) for j in JOBS}
    for pj in pytorchjobs(cluster, namespace):
        found[f"pj/{pj['metadata']['name']}"] = str(pj["metadata"]["resourceVersion"])
    return found


async def test_a_restart_with_running_jobs_decides_every_job_and_writes_nothing(
    crds: KubeCluster, namespace: str, operator: Callable[..., OperatorProcess]
) -> None:
    port = free_port()
    op = operator(f"--metrics-port={port}", "--metrics-addr=127.0.0.1")
    for job in JOBS:
        await asyncio.to_thread(apply, crds, namespace, dispatch_job(job, nodes=1))

    def all_running() -> bool:
        bodies = [get_job(crds, namespace, j) for j in JOBS]
        return all((b.get("status") or {}).get("observedState") == "running" for b in bodies)

    await await_for("every job running", all_running)
    op.stop()
    before = await asyncio.to_thread(versions, crds, namespace)

    op.start()

    def decided() -> Any:
        found = DECIDED.findall(op.log())
        return found[1:] or None  # the second start's line

    (count,) = await await_for("the restarted operator's decided line", decided)
    assert count == str(len(JOBS))
    after = await asyncio.to_thread(versions, crds, namespace)
    assert after == before, "the restarted operator changed an unchanged job"
    metrics = await asyncio.to_thread(scrape, f"http://127.0.0.1:{port}/metrics")
    writes = {
        verb: samples(metrics, "dispatch_api_requests_total", verb=verb)
        for verb in ("create", "update", "patch", "delete")
    }
    assert writes == dict.fromkeys(writes, 0.0), f"the restarted operator wrote: {writes}"
    assert f"dispatch_startup_jobs {float(len(JOBS))}" in metrics


async def test_a_job_runs_without_a_get_of_its_dispatchjob(
    crds: KubeCluster, namespace: str, operator: Callable[..., OperatorProcess]
) -> None:
    """The store's watch keeps every version the loop needs (its own writes and finalizer patch
    included) and the uid the kit's ownerReference needs: from apply to running, no GET of it."""
    port = free_port()
    operator(f"--metrics-port={port}", "--metrics-addr=127.0.0.1")
    await asyncio.to_thread(apply, crds, namespace, dispatch_job("no-get", nodes=1))

    def running() -> bool:
        return (get_job(crds, namespace, "no-get").get("status") or {}).get("observedState") == "running"

    await await_for("the job running", running)
    metrics = await asyncio.to_thread(scrape, f"http://127.0.0.1:{port}/metrics")
    gets = samples(metrics, "dispatch_api_requests_total", verb="get", resource="dispatchjobs")
    assert gets == 0.0, f"the operator read the DispatchJob {gets:g} times"
    assert samples(metrics, "dispatch_api_requests_total", verb="create", resource="pytorchjobs") == 1.0
    # --write-qps auto: the real API server has Priority and Fairness, so no client-side limit
    assert "dispatch_write_limit_qps 0.0" in metrics


async def test_a_stopped_operator_leaves_kopf_nothing_to_wait_for_and_lets_go_of_the_lease(
    crds: KubeCluster, namespace: str, operator: Callable[..., OperatorProcess], api: Any
) -> None:
    """SIGTERM: our loop, watches and Lease renewals stop in kopf's cleanup activity, so kopf's wait
    for the tasks started after it (up to 5 s, then it cancels them) finds none of ours, and the
    Lease is free for a successor at once (the stop took 5.5 s before; measured by the scale
    benchmark, never asserted as a duration)."""
    op = operator("--leader-elect", f"--lease-namespace={namespace}")
    await asyncio.to_thread(apply, crds, namespace, dispatch_job("stopping", nodes=1))
    await await_for("the operator holding the Lease", lambda: holder(api, namespace))
    await await_for("its decided line", lambda: DECIDED.search(op.log()))
    await await_for("the job running", lambda: pytorchjobs(crds, namespace) or None)
    op.stop()
    assert op.wait_exit() == 0
    log = op.log()
    # Our wind-down ran as kopf's cleanup activity (before kopf waits for the tasks it did not
    # start) and left none of our tasks running.
    assert "Activity 'run.<locals>.stopping' succeeded." in log
    assert "still running after the stop" not in log
    assert await holder(api, namespace) == "", "the stopped operator kept the Lease"

"""The operator's one supervision loop (dispatch._kube.loop): after a restart with running jobs,
every job is known and decided (the log line the scale benchmark reads), and nothing is written:
an unchanged observed field is not written again, no object is touched."""

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
    get_job,
    pytorchjobs,
)
from tests.support.kube import KubeCluster

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
    op = operator()
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
    assert after == before, "the restarted operator wrote to an unchanged job"

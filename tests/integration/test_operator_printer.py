"""``kubectl get dispatchjobs`` shows what status shows, on the lab with the operator as a process.

The printer columns are the API server's (server-side Table, as kubectl prints it): State is the
observed state (``running`` while the PyTorchJob runs, where the record says ``pending``) and Cause
the cause status shows now, so the cause of a recovered run is gone while the next one runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from tests.integration.conftest import (
    OperatorProcess,
    apply,
    await_for,
    dispatch_job,
    get_job,
    released_pj,
)
from tests.support.kube import KubeCluster
from tests.support.lab import Kubeflow

pytestmark = pytest.mark.integration


def columns(cluster: KubeCluster, namespace: str, name: str) -> dict[str, str]:
    """The row of ``kubectl get dispatchjob -o wide``, by column name (an empty cell is "")."""
    text = cluster.kubectl("get", "dispatchjob", name, "-n", namespace, "-o", "wide")
    header, row = text.splitlines()[:2]
    names = header.split()
    starts = [header.index(f" {n} ") + 1 if i else 0 for i, n in enumerate(names[:-1])] + [
        header.rindex(names[-1])
    ]
    ends = [*starts[1:], None]
    cells = {n: row[s:e].strip() for n, s, e in zip(names, starts, ends, strict=True)}
    return {n: "" if v == "<none>" else v for n, v in cells.items()}


async def test_printer_columns_show_running_and_drop_a_recovered_cause(
    crds: KubeCluster,
    namespace: str,
    operator: Callable[..., OperatorProcess],
    kubeflow: Kubeflow,
) -> None:
    operator()
    await asyncio.to_thread(apply, crds, namespace, dispatch_job("printed"))

    def row() -> dict[str, str]:
        return columns(crds, namespace, "printed")

    name1 = (await released_pj(crds, namespace, 1))["metadata"]["name"]
    await asyncio.wait_for(kubeflow.wait_pods(namespace, name1, 2), 60)
    first = await await_for("State running", lambda: (r := row())["STATE"] == "running" and r)
    assert first["CAUSE"] == "", first
    assert first["SUBMISSION"] == "1", first
    # the record (what GitOps tools read) is unchanged: a running job is recorded pending
    assert (await asyncio.to_thread(get_job, crds, namespace, "printed"))["status"]["state"] == "pending"

    await kubeflow.preempt(namespace, name1)
    name2 = (await released_pj(crds, namespace, 2))["metadata"]["name"]
    await asyncio.wait_for(kubeflow.wait_pods(namespace, name2, 2), 60)
    second = await await_for(
        "State running, submission 2",
        lambda: (r := row())["STATE"] == "running" and r["SUBMISSION"] == "2" and r,
    )
    assert second["CAUSE"] == "", second
    body = await asyncio.to_thread(get_job, crds, namespace, "printed")
    assert body["status"]["submissions"][0]["cause"]["kind"] == "preempted"  # recorded, not shown
    # ...and it stays so while the run goes on (the operator's later looks write nothing new)
    for _ in range(5):
        await asyncio.sleep(0.5)
        again = await asyncio.to_thread(row)
        assert (again["STATE"], again["CAUSE"]) == ("running", ""), again

    await kubeflow.succeed(namespace, name2)
    done = await await_for("State succeeded", lambda: (r := row())["STATE"] == "succeeded" and r)
    assert done["CAUSE"] == "", done
    assert done["SUBMISSION"] == "2", done
    body = await asyncio.to_thread(get_job, crds, namespace, "printed")
    assert body["status"]["state"] == "succeeded"
    assert body["status"]["observedState"] == "succeeded"

"""Every Kubernetes backend of the registry, run under exactly the RBAC the chart grants it.

For each backend the chart is installed with ``backends={<name>}`` (so its Role holds the base
rules plus that backend's declared ones, nothing of the others), the operator runs as the chart's
ServiceAccount with ``--backend <name>``, and the backend's example (``examples/<name>-dispatchjob.yaml``,
which every backend ships) is applied as a user would. The lab's kwok then ends every pod of the
first submission with exit code 0, and the job must succeed with no request refused. The list of
backends is the registry's: a backend registered without an example, or whose declared RBAC is
short of what its adapter does, fails here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatch._registry import kubernetes_backends
from e2e.support import REPO, Release, assert_no_forbidden, kubectl_wait, start_operator
from tests.integration.conftest import apply, await_for, get_job
from tests.support.kube import KubeCluster
from tests.support.lab import Kubeflow, Lab

pytestmark = pytest.mark.e2e

EXTRAS: dict[str, tuple[str, ...]] = {"jobset": ("jobset",), "trainjob": ("trainer",)}
"""The lab extras whose controllers a backend's objects need (the others come with every lab)."""

BACKENDS = sorted(b.name for b in kubernetes_backends())


def example(backend: str) -> dict[str, Any]:
    path = REPO / "examples" / f"{backend}-dispatchjob.yaml"
    assert path.is_file(), f"backend {backend!r} is registered but ships no example ({path.name})"
    body: dict[str, Any] = yaml.safe_load(path.read_text())
    assert body["spec"]["backend"] == backend, path
    return body


def other_resources(backend: str) -> list[tuple[str, str]]:
    """(verb, resource) the other backends' declared rules name and this one's do not."""
    mine = {
        (verb, f"{res}.{group}" if group else res)
        for b in kubernetes_backends()
        if b.name == backend
        for rule in b.rbac
        for group in rule.api_groups
        for res in rule.resources
        for verb in rule.verbs
    }
    return sorted(
        {
            ("create", f"{res}.{group}" if group else res)
            for b in kubernetes_backends()
            if b.name != backend
            for rule in b.rbac
            if "create" in rule.verbs
            for group in rule.api_groups
            for res in rule.resources
        }
        - mine
    )


async def succeed_first_submission(kubeflow: Kubeflow, namespace: str, job: str, nodes: int) -> None:
    """Every pod of submission 1 exits 0 once all of them run (a Master last: PyTorchJob's rule)."""
    await kubeflow.wait_workload_pods(namespace, job, 1, nodes)
    pods = await kubeflow.workload_pods(namespace, job, 1)
    running = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
    running.sort(key=lambda p: ("master" in p["metadata"]["name"], p["metadata"]["name"]))
    for pod in running:
        container = pod["spec"]["containers"][0]["name"]
        await kubeflow.exit_pod(namespace, pod["metadata"]["name"], 0, container=container)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_each_backend_runs_under_exactly_the_rbac_the_chart_grants_it(
    backend: str,
    release: Callable[..., Release],
    lab: Lab,
    kubeflow: Kubeflow,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    if EXTRAS.get(backend):
        request.getfixturevalue("lab_extras")
    body = example(backend)
    rel = release(install=False)  # its namespace is named after it: known only now
    namespace = rel.namespace
    rel.values += [f"watchNamespaces={{{namespace}}}", f"backends={{{backend}}}"]
    rel.install()
    for verb, resource in other_resources(backend):
        assert not rel.can_i(verb, resource, namespace), (
            f"chart with backends={{{backend}}} grants {verb} {resource}"
        )
    name = f"e2e-{backend}"
    body["metadata"] = {"name": name}
    op = start_operator(rel, namespace, tmp_path, f"--backend={backend}", tag=f"-{backend}")
    cluster: KubeCluster = rel.cluster
    await asyncio.to_thread(apply, cluster, namespace, yaml.safe_dump(body))
    async with asyncio.timeout(180):
        await succeed_first_submission(kubeflow, namespace, name, int(body["spec"].get("nodes", 1)))
        await kubectl_wait(cluster, namespace, name, "Succeeded")
        await await_for("settled", lambda: get_job(cluster, namespace, name)["status"].get("settled"))
    status = (await asyncio.to_thread(get_job, cluster, namespace, name))["status"]
    assert status["state"] == "succeeded"
    assert [s["n"] for s in status["submissions"]] == [1]
    op.stop()
    assert_no_forbidden(op)

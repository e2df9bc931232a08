"""The e2e tier: the Helm chart installed into a real API server, the operator under its identity.

By default the lab of ``tests.support.kube`` (the real training operator, kube-scheduler,
kube-controller-manager, kwok nodes; no kubelet, no images: the chart's Deployment gets pods that
kwok pretends to run, so the operator runs here as a local process with exactly the chart's
ServiceAccount identity). ``DISPATCH_E2E_KUBECONFIG`` points the tier at an
existing cluster instead (``make e2e-kind``); the chart is installed with ``replicas=0`` there too,
so no in-cluster operator competes with the processes under test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

# The fixtures of the operator's integration tier: an admin API client, the PyTorchJob watch.
# Their `crds` fixture is replaced below: here the chart installs the DispatchJob CRD; Kubeflow's
# PyTorchJob CRD comes with the real training operator (the lab's, or the existing cluster's).
# `kubeflow` (the lab's failure mechanisms) comes from tests.support.kube.
from tests.integration.conftest import api, release_monitor
from tests.support.helm import helm_binary
from tests.support.kube import KubeCluster

from .support import Helm, Release, short_name

# kube_cluster and namespace come from tests.support.kube, registered by the root conftest.py.

__all__ = ["api", "release_monitor"]


@pytest.fixture(scope="session")
def crds(kube_cluster: KubeCluster) -> KubeCluster:
    """Kubeflow's PyTorchJob CRD (Kubeflow installs it, not our chart), established."""
    kube_cluster.wait_established("pytorchjobs.kubeflow.org")
    return kube_cluster


@pytest.fixture(scope="session")
def helm(kube_cluster: KubeCluster, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    binary = helm_binary()
    if binary is None:
        pytest.fail("helm not found: run `make bins` or set DISPATCH_HELM", pytrace=False)
    return Helm(binary=binary, cluster=kube_cluster, home=tmp_path_factory.mktemp("helm"))


@pytest.fixture
def release(helm: Helm, crds: KubeCluster) -> Iterator[Callable[..., Release]]:
    """A factory: ``release(*values)`` installs the chart as a new release in a new namespace.

    Afterwards every release is uninstalled (the CRD stays) and its namespace deletion requested.
    """
    made: list[Release] = []

    def make(*values: str, install: bool = True) -> Release:
        name = short_name("dso")
        helm.cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        rel = Release(helm=helm, name=name, namespace=name, values=list(values))
        made.append(rel)
        if install:
            rel.install()
        return rel

    yield make
    for rel in made:
        rel.uninstall(check=False)
        helm.cluster.kubectl(
            "delete", "namespace", rel.namespace, "--wait=false", "--ignore-not-found", check=False
        )

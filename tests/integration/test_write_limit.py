"""``--write-qps auto`` on real API servers: the lab's kube-apiserver, which has API
Priority and Fairness as every server since Kubernetes 1.20 does by default, and one started here
with it turned off (``--enable-priority-and-fairness=false``), as a server that cannot protect
itself. The first gets no client-side limit, the second Kueue's; the answers come from the real
servers, the local server of the unit tests only gives the errors these cannot be made to give."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from dispatch._controller.main import WRITE_QPS_AUTO, choose_write_limit
from dispatch._kubeclient import DEFAULT_WRITE_QPS, KubeClient, new_client, server_sheds_load
from tests.support.controlplane import ControlPlane, resolve_binaries

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def without_fairness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    cp = ControlPlane(
        tmp_path_factory.mktemp("no-fairness"),
        binaries=resolve_binaries(),
        extra_apiserver_args=["--enable-priority-and-fairness=false"],
    )
    with cp:
        yield cp


async def test_the_lab_sheds_load_itself_so_auto_sets_no_limit(api: KubeClient) -> None:
    assert await server_sheds_load(api)
    assert await choose_write_limit(api, WRITE_QPS_AUTO) == 0.0


async def test_a_server_without_fairness_gets_kueues_limit(without_fairness: ControlPlane) -> None:
    client = await new_client(str(without_fairness.kubeconfig))
    async with client:
        assert not await server_sheds_load(client)
        assert await choose_write_limit(client, WRITE_QPS_AUTO) == DEFAULT_WRITE_QPS
        assert await choose_write_limit(client, 7.0) == 7.0  # a number is always the user's
    await asyncio.sleep(0.1)

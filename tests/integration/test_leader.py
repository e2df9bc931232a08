"""Lease-based leader election against a real kube-apiserver.

Timings are short (lease 3 s, renew deadline 2 s, retry 0.25 s) so the tests are quick; the
assertions are about who holds the Lease and what the Lease records, never about how fast.
The candidates act as a ServiceAccount bound to exactly the Role the chart grants for leases
(get/create/update), so these tests also prove that Role is enough.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import pytest
from kubernetes_asyncio import config
from kubernetes_asyncio.client import ApiClient, Configuration, CoordinationV1Api

from dispatch._controller.leader import LeaderElector
from tests.support.kube import KubeCluster

pytestmark = pytest.mark.integration

LEASE = "dispatch-operator"
SA = "dispatch-operator"
FAST: dict[str, float] = {"lease_duration": 3.0, "renew_deadline": 2.0, "retry_period": 0.25}


async def _client(kubeconfig: Path) -> ApiClient:
    cfg = Configuration()
    await config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    return ApiClient(cfg)


def _lease_role(namespace: str) -> list[dict[str, Any]]:
    """The same rules as the chart's leader-election Role (charts/dispatch-operator)."""
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "leader-election", "namespace": namespace},
            "rules": [
                {
                    "apiGroups": ["coordination.k8s.io"],
                    "resources": ["leases"],
                    "verbs": ["get", "create", "update"],
                }
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "leader-election", "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "leader-election"},
            "subjects": [{"kind": "ServiceAccount", "name": SA, "namespace": namespace}],
        },
    ]


@pytest.fixture
def namespace(kube_cluster: KubeCluster) -> Iterator[str]:
    """A short namespace name: the ServiceAccount identity is a client certificate whose CN
    (``system:serviceaccount:NS:NAME``) X.509 limits to 64 characters."""
    name = f"lease-{secrets.token_hex(3)}"
    kube_cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    try:
        yield name
    finally:
        kube_cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


@pytest.fixture
async def clients(kube_cluster: KubeCluster, namespace: str) -> AsyncIterator[list[ApiClient]]:
    """Three API clients (one per candidate) acting as the operator's ServiceAccount."""
    kube_cluster.apply(_lease_role(namespace))
    kubeconfig = kube_cluster.serviceaccount_kubeconfig(namespace, SA)
    made = [await _client(kubeconfig) for _ in range(3)]
    try:
        yield made
    finally:
        for c in made:
            await c.close()


@pytest.fixture
async def admin(kube_cluster: KubeCluster) -> AsyncIterator[CoordinationV1Api]:
    client = await _client(kube_cluster.kubeconfig)
    try:
        yield CoordinationV1Api(client)
    finally:
        await client.close()


async def _cancel(*tasks: asyncio.Task[Any]) -> None:
    for t in tasks:
        t.cancel()
    for t in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await t


def _never_lost() -> None:
    raise AssertionError("leadership lost unexpectedly")


async def test_exactly_one_leader_among_two(
    clients: list[ApiClient], namespace: str, admin: CoordinationV1Api
) -> None:
    a = LeaderElector(clients[0], namespace, LEASE, "candidate-a", **FAST)
    b = LeaderElector(clients[1], namespace, LEASE, "candidate-b", **FAST)
    acquiring = {asyncio.create_task(a.acquire()): a, asyncio.create_task(b.acquire()): b}
    done, pending = await asyncio.wait(acquiring, return_when=asyncio.FIRST_COMPLETED)
    assert len(done) == 1
    leader = acquiring[done.pop()]
    (waiting_task,) = pending
    follower = acquiring[waiting_task]
    holding = asyncio.create_task(leader.hold(_never_lost))
    try:
        # Several lease durations pass while the leader renews: the follower must stay waiting.
        for _ in range(4):
            await asyncio.sleep(FAST["lease_duration"])
            lease = await admin.read_namespaced_lease(LEASE, namespace)
            assert lease.spec.holder_identity == leader.identity
            assert not waiting_task.done()
            assert leader.is_leader
            assert not follower.is_leader
        assert lease.spec.lease_transitions == 0
    finally:
        await _cancel(holding, waiting_task)
        await leader.release()


async def test_concurrent_attempts_on_a_free_lease_have_one_winner(
    clients: list[ApiClient], namespace: str, admin: CoordinationV1Api
) -> None:
    """Each round, three candidates write at once to a free Lease: the resourceVersion
    precondition lets exactly one through."""
    electors = [LeaderElector(c, namespace, LEASE, f"racer-{i}", **FAST) for i, c in enumerate(clients)]
    for _ in range(5):
        results = await asyncio.gather(*(e._try_acquire_or_renew() for e in electors))
        winners = [e.identity for e, r in zip(electors, results, strict=True) if r and r.holder == e.identity]
        assert len(winners) == 1, winners
        lease = await admin.read_namespaced_lease(LEASE, namespace)
        assert lease.spec.holder_identity == winners[0]
        (winner,) = (e for e in electors if e.identity == winners[0])
        winner._leading = True
        assert await winner.release()
        lease = await admin.read_namespaced_lease(LEASE, namespace)
        assert not lease.spec.holder_identity


async def test_takeover_after_the_leader_stops_renewing(
    clients: list[ApiClient], namespace: str, admin: CoordinationV1Api
) -> None:
    old = LeaderElector(clients[0], namespace, LEASE, "old-leader", **FAST)
    new = LeaderElector(clients[1], namespace, LEASE, "standby", **FAST)
    await old.acquire()
    holding = asyncio.create_task(old.hold(_never_lost))
    standby = asyncio.create_task(new.acquire())
    await asyncio.sleep(FAST["lease_duration"] * 2)
    assert not standby.done()
    # The leader "dies": it stops renewing and never releases.
    await _cancel(holding)
    before = await admin.read_namespaced_lease(LEASE, namespace)
    await asyncio.wait_for(standby, timeout=60)
    after = await admin.read_namespaced_lease(LEASE, namespace)
    assert after.spec.holder_identity == "standby"
    assert after.spec.lease_transitions == before.spec.lease_transitions + 1
    # Taken over only once the old holder's renewTime + leaseDurationSeconds had passed.
    expiry = before.spec.renew_time + timedelta(seconds=before.spec.lease_duration_seconds)
    assert after.spec.acquire_time >= expiry
    # The old leader's later renewal attempt finds the Lease held by the standby: it gives up.
    lost = asyncio.Event()
    old._leading = True
    await asyncio.wait_for(old.hold(lost.set), timeout=60)
    assert lost.is_set()
    assert not old.is_leader
    assert await new.release()


async def test_release_on_shutdown_hands_over_before_expiry(
    clients: list[ApiClient], namespace: str, admin: CoordinationV1Api
) -> None:
    slow = {"lease_duration": 60.0, "renew_deadline": 40.0, "retry_period": 0.25}
    old = LeaderElector(clients[0], namespace, LEASE, "leaving", **slow)
    new = LeaderElector(clients[1], namespace, LEASE, "next", **slow)
    await old.acquire()
    holding = asyncio.create_task(old.hold(_never_lost))
    standby = asyncio.create_task(new.acquire())
    await asyncio.sleep(1.0)
    assert not standby.done()
    await _cancel(holding)
    before = await admin.read_namespaced_lease(LEASE, namespace)
    assert await old.release()
    assert not old.is_leader
    released = await admin.read_namespaced_lease(LEASE, namespace)
    assert not released.spec.holder_identity
    await asyncio.wait_for(standby, timeout=50)
    after = await admin.read_namespaced_lease(LEASE, namespace)
    assert after.spec.holder_identity == "next"
    # Taken well before the released holder's lease would have expired.
    assert after.spec.acquire_time < before.spec.renew_time + timedelta(seconds=60)
    # Releasing a Lease one does not hold changes nothing.
    assert not await old.release()
    assert (await admin.read_namespaced_lease(LEASE, namespace)).spec.holder_identity == "next"


async def test_lost_when_renewals_fail_for_the_renew_deadline(
    clients: list[ApiClient], namespace: str
) -> None:
    elector = LeaderElector(clients[0], namespace, LEASE, "cut-off", **FAST)
    await elector.acquire()
    # Cut the leader off from the API server: every renewal now fails to connect.
    unreachable = Configuration(host="https://127.0.0.1:9")
    dead = ApiClient(unreachable)
    try:
        elector._api = dead
        lost = asyncio.Event()
        await asyncio.wait_for(elector.hold(lost.set), timeout=60)
        assert lost.is_set()
        assert not elector.is_leader
    finally:
        await dead.close()


async def test_async_on_lost_is_awaited(
    clients: list[ApiClient], namespace: str, admin: CoordinationV1Api
) -> None:
    elector = LeaderElector(clients[0], namespace, LEASE, "stolen-from", **FAST)
    await elector.acquire()
    lease = await admin.read_namespaced_lease(LEASE, namespace)
    lease.spec.holder_identity = "usurper"
    await admin.replace_namespaced_lease(LEASE, namespace, lease)
    called: list[str] = []

    async def on_lost() -> None:
        await asyncio.sleep(0)
        called.append("lost")

    await asyncio.wait_for(elector.hold(on_lost), timeout=60)
    assert called == ["lost"]


def test_rejects_inconsistent_timings() -> None:
    with pytest.raises(ValueError, match="lease_duration > renew_deadline"):
        LeaderElector(cast(Any, None), "ns", "n", "me", 10.0, 10.0, 2.0)

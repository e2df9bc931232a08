"""Smoke test of the test control plane (etcd + kube-apiserver built by `make bins`).

Proves what the operator's tests rely on: CRDs with a status subresource, watches,
resourceVersion preconditions on /status (409 on a stale write, PUT and merge patch)
and RBAC (403 for an identity without bindings; a ServiceAccount identity gains access
through a RoleBinding).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import config, watch
from kubernetes_asyncio.client import ApiClient, Configuration, CustomObjectsApi, VersionApi
from kubernetes_asyncio.client.exceptions import ApiException

from dispatch._kubeclient import streamed
from tests.support.kube import KubeCluster

pytestmark = pytest.mark.integration

GROUP = "smoke.dispatch.dev"
VERSION = "v1"
PLURAL = "widgets"
CRD_NAME = f"{PLURAL}.{GROUP}"
# The generated client would pick another patch type for a dict body; force a JSON merge
# patch (the stubs do not declare _content_type, hence the dict).
MERGE_PATCH: dict[str, Any] = {"_content_type": "application/merge-patch+json"}

CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": CRD_NAME},
    "spec": {
        "group": GROUP,
        "scope": "Namespaced",
        "names": {"plural": PLURAL, "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
        "versions": [
            {
                "name": VERSION,
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {"type": "object", "properties": {"size": {"type": "integer"}}},
                            "status": {"type": "object", "properties": {"phase": {"type": "string"}}},
                        },
                    }
                },
            }
        ],
    },
}


async def _client(kubeconfig: Path) -> ApiClient:
    cfg = Configuration()
    await config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    return ApiClient(cfg)


@pytest.fixture
async def admin(kube_cluster: KubeCluster) -> AsyncIterator[ApiClient]:
    api = await _client(kube_cluster.kubeconfig)
    async with api:
        yield api


async def _expect_status(code: int, coro: Any) -> dict[str, Any]:
    """Await CORO, require an HTTP error with status CODE, return the decoded Status body."""
    with pytest.raises(ApiException) as info:
        await coro
    assert info.value.status == code, info.value
    body: dict[str, Any] = json.loads(info.value.body or b"{}")
    assert body["kind"] == "Status"
    assert body["code"] == code
    return body


async def _list_when_served(co: CustomObjectsApi, namespace: str) -> Any:
    """List the widgets once the new CRD's endpoint serves.

    Established does not mean served yet: for a moment the endpoint answers 404 and then
    429 "storage is (re)initializing" while its watch cache fills.
    """
    for _ in range(300):
        try:
            return await co.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
        except ApiException as e:
            if e.status not in (404, 429):
                raise
            await asyncio.sleep(0.1)
    raise AssertionError(f"{CRD_NAME} never served")


async def test_controlplane_smoke(kube_cluster: KubeCluster, namespace: str, admin: ApiClient) -> None:
    if not kube_cluster.external:
        info = await VersionApi(admin).get_code()
        assert info.git_version.startswith("v1."), info.git_version  # ldflags took effect

    kube_cluster.apply(CRD)
    kube_cluster.wait_for_condition("crd", CRD_NAME, None, "Established", timeout=60)
    co = CustomObjectsApi(admin)

    # --- watch: see the ADDED event of an object created after the watch's start point.
    listing = await _list_when_served(co, namespace)
    start_rv = listing["metadata"]["resourceVersion"]
    name = "w1"
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Widget",
        "metadata": {"name": name},
        "spec": {"size": 1},
    }
    created = await co.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    async with watch.Watch() as w:
        stream = w.stream(
            co.list_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            resource_version=start_rv,
            timeout_seconds=30,
        )
        event = await asyncio.wait_for(anext(stream), timeout=30)
        response: Any = w.resp  # set by stream() (the client declares it None)
        async with streamed(response):  # left mid-stream: its socket goes at once
            pass
    assert event["type"] == "ADDED"
    assert event["raw_object"]["metadata"]["name"] == name
    assert event["raw_object"]["metadata"]["uid"] == created["metadata"]["uid"]

    # --- PUT /status with the resourceVersion just read: accepted, resourceVersion moves.
    current = await co.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    read_rv = current["metadata"]["resourceVersion"]
    current["status"] = {"phase": "First"}
    updated = await co.replace_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, name, current
    )
    assert updated["status"] == {"phase": "First"}
    new_rv = updated["metadata"]["resourceVersion"]
    assert new_rv != read_rv

    # --- PUT /status with the now stale resourceVersion: 409 Conflict.
    stale = dict(current)
    stale["metadata"] = {**current["metadata"], "resourceVersion": read_rv}
    stale["status"] = {"phase": "StalePut"}
    conflict = await _expect_status(
        409,
        co.replace_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, name, stale),
    )
    assert conflict["reason"] == "Conflict"

    # --- merge patch of /status carrying a stale metadata.resourceVersion: 409 as well ...
    conflict = await _expect_status(
        409,
        co.patch_namespaced_custom_object_status(
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            name,
            {"metadata": {"resourceVersion": read_rv}, "status": {"phase": "StalePatch"}},
            **MERGE_PATCH,
        ),
    )
    assert conflict["reason"] == "Conflict"
    # ... while the same patch with the current resourceVersion is accepted.
    patched = await co.patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        name,
        {"metadata": {"resourceVersion": new_rv}, "status": {"phase": "Patched"}},
        **MERGE_PATCH,
    )
    assert patched["status"] == {"phase": "Patched"}
    final = await co.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    assert final["status"] == {"phase": "Patched"}

    # --- RBAC: an identity without any binding is forbidden.
    # (On an existing cluster only ServiceAccount identities can be minted.)
    if kube_cluster.external:
        nobody_kc = kube_cluster.serviceaccount_kubeconfig(namespace, "smoke-nobody")
    else:
        nobody_kc = kube_cluster.mint_user("smoke-nobody", [])
    async with await _client(nobody_kc) as nobody:
        await _expect_status(
            403,
            CustomObjectsApi(nobody).list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL),
        )

    # --- A ServiceAccount identity: forbidden, then allowed through a RoleBinding.
    sa_kc = kube_cluster.serviceaccount_kubeconfig(namespace, "smoke-reader")
    kube_cluster.apply(
        [
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": {"name": "widget-reader", "namespace": namespace},
                "rules": [{"apiGroups": [GROUP], "resources": [PLURAL], "verbs": ["get", "list"]}],
            },
        ]
    )
    async with await _client(sa_kc) as sa:
        sa_co = CustomObjectsApi(sa)
        await _expect_status(403, sa_co.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL))
        kube_cluster.apply(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": "widget-reader", "namespace": namespace},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "widget-reader"},
                "subjects": [{"kind": "ServiceAccount", "name": "smoke-reader", "namespace": namespace}],
            }
        )
        for _ in range(100):  # the RBAC authorizer's informer catches up within moments
            try:
                seen = await sa_co.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
                break
            except ApiException as e:
                if e.status != 403:
                    raise
                await asyncio.sleep(0.1)
        else:
            raise AssertionError("RoleBinding for the ServiceAccount never took effect")
        assert [item["metadata"]["name"] for item in seen["items"]] == [name]


@pytest.mark.integration
def test_serviceaccount_identity_with_a_long_name(kube_cluster: KubeCluster, namespace: str) -> None:
    """A ServiceAccount whose user name outgrows a certificate's CN still gets its own identity."""
    name = "an-operator-with-a-rather-long-service-account-name"
    user = f"system:serviceaccount:{namespace}:{name}"
    assert len(user) > 64
    kubeconfig = kube_cluster.serviceaccount_kubeconfig(namespace, name)
    who = json.loads(kube_cluster.kubectl("auth", "whoami", "-o", "json", kubeconfig=kubeconfig))
    assert who["status"]["userInfo"]["username"] == user

"""The kit's disruption Events from its watches, on the lab (real kube-apiserver, kube-scheduler,
training operator, kwok): a preemption that happened while no kit ran (its pod deleted, so no pod
says why) is explained by kube-scheduler's Preempted Event from the kit's Events watch, with no
Events LIST (bench-operator: the LIST was 55% of the operator's CPU after a mass preemption).

Run: ``.venv/bin/pytest tests/integration/test_kit_events_watch.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient

from dispatch import CauseKind, Phase, Rule, make_plan
from dispatch._backends.kubeflow._adapter import CAPABILITIES, KubeflowBackend
from tests.support.kube import KubeCluster
from tests.support.kubeflow_adapter import GUARD, create_owner, phase_is, spec_of, until
from tests.support.lab import Kubeflow

pytestmark = pytest.mark.integration


class Counted:
    """The API client, with the Events reads it sends written down (the server is the real one)."""

    def __init__(self, api: ApiClient) -> None:
        self.api = api
        self.events: list[dict[str, str]] = []

    async def call_api(
        self, path: str, method: str, *, query_params: Iterable[tuple[str, str]], **rest: Any
    ) -> Any:
        query = list(query_params)
        if path.endswith("/events"):
            self.events.append(dict(query))
        return await self.api.call_api(path, method, query_params=query, **rest)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.api, name)


async def test_a_preemption_before_the_kit_started_is_read_from_the_events_watch(
    kube_cluster: KubeCluster, namespace: str, api: ApiClient, kubeflow: Kubeflow
) -> None:
    name = "evwatch"
    job = await create_owner(kube_cluster, namespace, name)
    spec = spec_of(name, rules=[Rule(on=(CauseKind.PREEMPTED,), budget=1)])
    first = KubeflowBackend(api)
    try:
        oid = await first.create(job, 1, spec, make_plan(job, spec, CAPABILITIES, supervised=True))
        await first.release(oid)
        async with asyncio.timeout(GUARD):
            victim = (await kubeflow.wait_pods(namespace, f"{name}-1", 1))[0]["metadata"]
    finally:
        await first.aclose()  # no kit runs from here on: nobody sees the pod's last words
    async with asyncio.timeout(GUARD):
        await kubeflow.preempt(namespace, f"{name}-1")
        await kubeflow.wait_pod_gone(namespace, victim["name"], victim["uid"])

    counted = Counted(api)
    second = KubeflowBackend(counted)  # type: ignore[arg-type]
    try:
        # Its watches start with the first subscriber; wait for the Events watches' first list
        # so that the look for evidence below is the index's, not the fallback LIST.
        second.subscribe(job, lambda: None)
        async with asyncio.timeout(GUARD):
            await asyncio.gather(*(i.synced.wait() for i in second.cache.events.informers[None]))
        views = await until(second, job, phase_is(oid, Phase.ENDED))
    finally:
        await second.aclose()
    [view] = views
    assert view.cause is not None
    assert view.cause.kind is CauseKind.PREEMPTED, view.cause
    assert "from its event" in view.cause.detail, view.cause
    looks = [q for q in counted.events if "watch" not in q and "limit" not in q]
    assert looks == [], looks  # the watches listed (with limit) and watched; no lookup read them
    watched = {q["fieldSelector"] for q in counted.events if "watch" in q}
    assert "involvedObject.kind=Pod,reason=Preempted" in watched

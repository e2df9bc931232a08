"""The Kubeflow adapter's tests on the lab, shared by its own suite and the kit's watch tests:
the JobSpec they submit, the DispatchJob that owns their PyTorchJobs, and waiting on the adapter's
wakes (never polling the adapter; what it does not watch is asked until true).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from dispatch import JobSpec, KubeflowOptions, ObjectView, Phase, RecoveryPolicy, Resources, Rule
from dispatch._backends.kubeflow._adapter import KubeflowBackend
from dispatch._kubeclient import Client, request
from tests.support.builders import owner_manifest
from tests.support.kube import KubeCluster

PJ = "/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs"


GUARD = 120.0
"""Only a guard against a hang: no assertion is about time (pod GC after a node deletion takes
about a minute)."""


def spec_of(
    name: str,
    *,
    nodes: int = 1,
    rules: Sequence[Rule] = (),
    gpu: int = 1,
    image: str = "example.invalid/train:1",
    **options: Any,
) -> JobSpec:
    return JobSpec(
        name=name,
        command=("python", "train.py", "--epochs", "3"),
        nodes=nodes,
        recovery=RecoveryPolicy(rules=tuple(rules)),
        kubeflow=KubeflowOptions(
            image=image,
            env={"WANDB_MODE": "offline"},
            resources=Resources(cpu="2", memory="4Gi", gpu=gpu),
            **options,
        ),
    )


async def create_owner(kube_cluster: KubeCluster, namespace: str, name: str) -> str:
    kube_cluster.apply(owner_manifest(namespace, name))
    return f"{namespace}/{name}"


async def until(
    backend: KubeflowBackend, job: str, predicate: Callable[[Sequence[ObjectView]], bool]
) -> Sequence[ObjectView]:
    """List ``job``'s objects after every wake until ``predicate`` holds (no polling). On the
    guard, fails with what the backend last listed, what it lists now, and what the API server
    holds, so that a hang tells a missed wake (the last two differ) from a world that never got
    there (all three agree)."""
    woken = asyncio.Event()
    unsubscribe = backend.subscribe(job, woken.set)
    views: Sequence[ObjectView] = ()
    try:
        async with asyncio.timeout(GUARD):
            while True:
                woken.clear()
                views = await backend.list(job)
                if predicate(views):
                    return views
                await woken.wait()
    except TimeoutError:
        now = await backend.list(job)
        ids = dict.fromkeys(v.id for v in (*views, *now))  # each object once, in order
        seen = {oid: await server_state(backend.api, oid) for oid in ids}
        raise AssertionError(
            f"{job}: no wake met the predicate in {GUARD:.0f}s\n"
            f"last listed: {views!r}\nlisted now: {now!r}\n"
            f"on the API server: {json.dumps(seen, indent=1, default=str)}"
        ) from None
    finally:
        unsubscribe()


async def server_state(api: Client, object_id: str) -> dict[str, Any]:
    """The PyTorchJob's status and its pods' phases and container statuses, as the API server has
    them (for a failure message)."""
    pj = await get_pj(api, object_id)
    return {
        "pytorchjob": pj and {"status": pj.get("status"), "annotations": pj["metadata"].get("annotations")},
        "pods": {
            p["metadata"]["name"]: {
                "phase": p.get("status", {}).get("phase"),
                "annotations": p["metadata"].get("annotations"),
                "containerStatuses": p.get("status", {}).get("containerStatuses"),
            }
            for p in await pods_of(api, object_id)
        },
    }


def phase_is(object_id: str, phase: Phase) -> Callable[[Sequence[ObjectView]], bool]:
    return lambda views: any(v.id == object_id and v.phase is phase for v in views)


async def get_pj(api: Client, object_id: str) -> dict[str, Any] | None:
    ns, name = object_id.split("/")
    listing = await request(api, "GET", PJ.format(ns=ns), query={"fieldSelector": f"metadata.name={name}"})
    items: list[dict[str, Any]] = listing.get("items") or []
    return items[0] if items else None


async def pods_of(api: Client, object_id: str) -> list[dict[str, Any]]:
    ns, name = object_id.split("/")
    listing = await request(
        api,
        "GET",
        f"/api/v1/namespaces/{ns}/pods",
        query={"labelSelector": f"training.kubeflow.org/job-name={name}"},
    )
    return list(listing.get("items") or [])


async def eventually(check: Callable[[], Awaitable[bool]]) -> None:
    """For what the adapter does not watch (pods left to other controllers): ask until true."""
    async with asyncio.timeout(GUARD):
        while True:
            if await check():
                return
            await asyncio.sleep(0.05)

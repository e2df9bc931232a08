"""``kubectl dispatch preempt`` and ``kubectl dispatch lose-node``: a failure made the way a
cluster makes it, so that a person trying dispatch watches a recovery without waiting for one.

Neither writes anything of dispatch's: each acts on the running submission's pods exactly as
Kubernetes itself does, and dispatch reads the cause from what Kubernetes wrote.

* ``preempt``: one pod of the running submission is evicted through the Eviction API, as
  ``kubectl drain`` or a preempting scheduler's eviction does (it honours PodDisruptionBudgets).
  The pod's ``DisruptionTarget`` condition says ``EvictionByEvictionAPI``: cause ``preempted``.
* ``lose-node``: the node of one of its pods gets a ``NoExecute`` taint no pod of the job
  tolerates, as the node lifecycle controller taints a node that stops answering; the taint
  eviction controller deletes the pods there (``DeletionByTaintManager``: cause ``node-lost``).
  Once they are gone the taint is removed again, so the node takes pods once more.

An out-of-memory kill has no such API: it is the kernel's, in a container whose program allocates
past its limit (``docs/real-node.md`` shows one on a real node).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any, Final, TextIO

from .._constants import GROUP, LABEL_JOB
from .._errors import BackendError
from .._kubeclient import MERGE_PATCH, Client, KubeError, request

Body = Mapping[str, Any]

NODE_LOSS_TAINT: Final = f"{GROUP}/injected-node-loss"
"""The taint ``lose-node`` puts on a node for as long as the job's pods take to leave it."""
LEAVE_TIMEOUT: Final = 120.0
"""How long ``lose-node`` waits for the pods to leave before it removes the taint anyway."""


class NothingToDisrupt(Exception):
    """The job has no pod that runs on a node now."""


async def running_pods(api: Client, namespace: str, job: str) -> list[Body]:
    """The job's pods placed on a node and not ended, by name (a submission's pods carry the job's
    label from their template)."""
    found = await request(
        api, "GET", f"/api/v1/namespaces/{namespace}/pods", query={"labelSelector": f"{LABEL_JOB}={job}"}
    )
    pods = [
        p
        for p in found.get("items") or ()
        if (p.get("spec") or {}).get("nodeName")
        and (p.get("status") or {}).get("phase") in ("Pending", "Running")
        and not (p.get("metadata") or {}).get("deletionTimestamp")
    ]
    if not pods:
        raise NothingToDisrupt(f"DispatchJob {namespace}/{job} has no pod running on a node")
    return sorted(pods, key=lambda p: str(p["metadata"]["name"]))


async def preempt(api: Client, namespace: str, job: str, out: TextIO) -> int:
    """Evict the first running pod of ``job``."""
    pod = (await running_pods(api, namespace, job))[0]
    name = pod["metadata"]["name"]
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
    }
    await request(api, "POST", f"/api/v1/namespaces/{namespace}/pods/{name}/eviction", body=eviction)
    print(
        f"pod/{name} evicted on node {pod['spec']['nodeName']}: dispatch records the submission "
        f"preempted and its rules decide what follows (kubectl dispatch describe {job})",
        file=out,
    )
    return 0


async def lose_node(api: Client, namespace: str, job: str, out: TextIO) -> int:
    """Taint the node of ``job``'s first running pod ``NoExecute`` until its pods have left."""
    pods = await running_pods(api, namespace, job)
    node = str(pods[0]["spec"]["nodeName"])
    on_node = {p["metadata"]["name"] for p in pods if p["spec"]["nodeName"] == node}
    await _taint(api, node, add=True)
    print(f"node/{node} tainted {NODE_LOSS_TAINT}:NoExecute: its pods are evicted", file=out)
    try:
        deadline = time.monotonic() + LEAVE_TIMEOUT
        while time.monotonic() < deadline:
            left = {p["metadata"]["name"] for p in await _pods_on(api, namespace, job, node)}
            if not left & on_node:
                break
            await asyncio.sleep(0.5)
    finally:
        await _taint(api, node, add=False)
    print(
        f"node/{node} untainted; {', '.join(sorted(on_node))} left it: dispatch records the "
        f"submission node-lost (kubectl dispatch describe {job})",
        file=out,
    )
    return 0


async def _pods_on(api: Client, namespace: str, job: str, node: str) -> list[Body]:
    found = await request(
        api,
        "GET",
        f"/api/v1/namespaces/{namespace}/pods",
        query={"labelSelector": f"{LABEL_JOB}={job}", "fieldSelector": f"spec.nodeName={node}"},
    )
    return list(found.get("items") or ())


async def _taint(api: Client, node: str, *, add: bool) -> None:
    """Add or remove the taint: a merge patch of the whole list, at the version read, so a taint
    another controller writes meanwhile is not lost (a conflict reads again)."""
    for _ in range(10):
        current = await request(api, "GET", f"/api/v1/nodes/{node}")
        taints = [
            t for t in (current.get("spec") or {}).get("taints") or () if t.get("key") != NODE_LOSS_TAINT
        ]
        if add:
            taints.append({"key": NODE_LOSS_TAINT, "value": "true", "effect": "NoExecute"})
        patch = {
            "metadata": {"resourceVersion": current["metadata"]["resourceVersion"]},
            "spec": {"taints": taints},
        }
        try:
            await request(api, "PATCH", f"/api/v1/nodes/{node}", body=patch, content_type=MERGE_PATCH)
            return
        except KubeError as error:  # a conflict (409): another writer changed the node; read again
            if error.status != 409:
                raise
    raise BackendError(f"node/{node}: the taint could not be written (ten conflicts in a row)")

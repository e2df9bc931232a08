"""The lab's failure mechanisms as the tests call them (async, the old fake's method names):
:class:`Kubeflow` runs each :class:`~tests.support.lab_cluster.Lab` call in a thread and undoes its
node changes after the test.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from tests.support.lab_cluster import Lab
from tests.support.lab_setup import (
    NODE_CPU,
    NODE_GPU,
    NODE_MEMORY,
    ApiStatus,
)

# ---- the async facade for tests (the old fake's method names) ---------------------------


def pod_name(job: str, replica: str = "master", index: int = 0) -> str:
    """The training operator's pod naming: ``<job>-<replica type, lower case>-<index>``."""
    return f"{job}-{replica.lower()}-{index}"


def replica_count(pytorchjob: Mapping[str, Any]) -> int:
    """The number of pods a PyTorchJob's spec asks for (every replica type's ``replicas``)."""
    specs = (pytorchjob.get("spec") or {}).get("pytorchReplicaSpecs") or {}
    return sum(int((spec or {}).get("replicas", 1)) for spec in specs.values())


class Kubeflow:
    """Async access to the lab's mechanisms, addressed like the training operator's pods.

    Everything it changes on nodes (taints, NotReady, deletion, added nodes) and the training
    operator's state are restored by :meth:`restore` (the ``kubeflow`` fixture calls it).
    """

    def __init__(self, lab: Lab) -> None:
        self.lab = lab
        self._changed_nodes = False
        self._added: list[str] = []

    async def _run(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def pods(self, namespace: str, job: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = await self._run(
            self.lab.pods, namespace, f"training.kubeflow.org/job-name={job}"
        )
        return out

    async def wait_pods(self, namespace: str, job: str, count: int = 1) -> list[dict[str, Any]]:
        """Until the job has ``count`` Running pods (bound the wait with asyncio.timeout)."""
        while True:
            pods = [
                p for p in await self.pods(namespace, job) if p.get("status", {}).get("phase") == "Running"
            ]
            if len(pods) >= count:
                return pods
            await asyncio.sleep(0.1)

    # -- any workload's pods, found by dispatch's labels (Jobs, JobSets, TrainJobs, PyTorchJobs) --

    async def workload_pods(self, namespace: str, job: str, submission: int) -> list[dict[str, Any]]:
        """The pods of submission ``submission`` of the DispatchJob ``job``, whatever made them."""
        out: list[dict[str, Any]] = await self._run(
            self.lab.pods, namespace, f"dispatch.dev/job={job},dispatch.dev/submission={submission}"
        )
        return out

    async def wait_workload_pods(
        self, namespace: str, job: str, submission: int, count: int = 1, *, besides: Sequence[str] = ()
    ) -> list[str]:
        """Until ``count`` of them run (not counting the pods named in ``besides``); their names."""
        while True:
            names = sorted(
                p["metadata"]["name"]
                for p in await self.workload_pods(namespace, job, submission)
                if p.get("status", {}).get("phase") == "Running"
                and not p["metadata"].get("deletionTimestamp")
                and p["metadata"]["name"] not in besides
            )
            if len(names) >= count:
                return names
            await asyncio.sleep(0.1)

    async def exit_pod(
        self, namespace: str, name: str, code: int, *, reason: str | None = None, container: str = "main"
    ) -> None:
        await self._run(self.lab.exit_pod, namespace, name, code, reason=reason, container=container)

    async def preempt_pod(self, namespace: str, name: str) -> str:
        out: str = await self._run(self.lab.preempt_pod, namespace, name)
        return out

    async def wait_pod_gone(self, namespace: str, name: str, uid: str | None = None) -> None:
        while True:
            pod = await self._run(self.lab.pod, namespace, name)
            if pod is None or (uid is not None and pod["metadata"]["uid"] != uid):
                return
            await asyncio.sleep(0.1)

    async def replicas(self, namespace: str, job: str) -> int:
        """How many pods the PyTorchJob asks for (the training operator may create workers first);
        waits for the PyTorchJob to exist, as ``wait_pods`` waits for its pods."""
        path = f"/apis/kubeflow.org/v1/namespaces/{namespace}/pytorchjobs/{job}"
        while True:
            try:
                return replica_count(await self._run(self.lab.request, "GET", path))
            except ApiStatus as e:
                if e.code != 404:
                    raise
            await asyncio.sleep(0.1)

    async def succeed(self, namespace: str, job: str) -> None:
        """Every container exits 0, workers first, then the master: waits for every replica first,
        since exiting only the pods that happen to exist leaves a later one running forever."""
        pods = await self.wait_pods(namespace, job, await self.replicas(namespace, job))
        pods.sort(
            key=lambda p: (
                p["metadata"]["labels"].get("training.kubeflow.org/replica-type") == "master",
                p["metadata"]["name"],
            )
        )
        for pod in pods:
            await self._run(self.lab.exit_pod, namespace, pod["metadata"]["name"], 0)

    async def exit(
        self,
        namespace: str,
        job: str,
        code: int,
        replica: str = "master",
        index: int = 0,
        *,
        reason: str | None = None,
        message: str | None = None,
    ) -> None:
        await self._run(
            self.lab.exit_pod, namespace, pod_name(job, replica, index), code, reason=reason, message=message
        )

    async def oom(self, namespace: str, job: str, replica: str = "master", index: int = 0) -> None:
        await self.exit(namespace, job, 137, replica, index, reason="OOMKilled")

    async def preempt(
        self,
        namespace: str,
        job: str,
        replica: str = "master",
        index: int = 0,
        *,
        keep: bool = False,
        whole_node: bool = False,
    ) -> str:
        out: str = await self._run(
            self.lab.preempt_pod, namespace, pod_name(job, replica, index), keep=keep, whole_node=whole_node
        )
        return out

    async def evict(self, namespace: str, job: str, replica: str = "master", index: int = 0) -> None:
        await self._run(self.lab.evict_pod, namespace, pod_name(job, replica, index))

    async def _node_of(self, namespace: str, job: str, replica: str, index: int) -> str:
        out: str = await self._run(self.lab.pod_node, namespace, pod_name(job, replica, index))
        return out

    async def taint_evict(self, namespace: str, job: str, replica: str = "master", index: int = 0) -> str:
        node = await self._node_of(namespace, job, replica, index)
        self._changed_nodes = True
        await self._run(self.lab.taint_node, node)
        return node

    async def untaint(self, node: str) -> None:
        await self._run(self.lab.untaint_node, node)

    async def delete_node(self, namespace: str, job: str, replica: str = "master", index: int = 0) -> str:
        node = await self._node_of(namespace, job, replica, index)
        self._changed_nodes = True
        await self._run(self.lab.delete_node, node)
        return node

    async def node_not_ready(self, namespace: str, job: str, replica: str = "master", index: int = 0) -> str:
        node = await self._node_of(namespace, job, replica, index)
        self._changed_nodes = True
        await self._run(self.lab.node_not_ready, node)
        return node

    async def node_ready(self, node: str) -> None:
        await self._run(self.lab.node_ready, node)

    async def add_node(self, *, cpu: str = NODE_CPU, memory: str = NODE_MEMORY, gpu: int = NODE_GPU) -> str:
        name = f"kwok-extra-{secrets.token_hex(3)}"
        self._added.append(name)
        out: str = await self._run(self.lab.add_node, name, cpu=cpu, memory=memory, gpu=gpu)
        return out

    async def delete_pod(self, namespace: str, name: str, grace_seconds: int | None = None) -> None:
        await self._run(self.lab.delete_pod, namespace, name, grace_seconds=grace_seconds)

    async def deadline(self, namespace: str, job: str, replica: str = "master", index: int = 0) -> None:
        await self._run(self.lab.deadline_pod, namespace, pod_name(job, replica, index))

    async def node_shutdown(self, namespace: str, job: str, replica: str = "master", index: int = 0) -> None:
        await self._run(self.lab.shutdown_pod, namespace, pod_name(job, replica, index))

    async def waiting(
        self,
        namespace: str,
        job: str,
        reason: str,
        message: str = "",
        replica: str = "master",
        index: int = 0,
    ) -> None:
        await self._run(self.lab.waiting_pod, namespace, pod_name(job, replica, index), reason, message)

    async def stop_training_operator(self) -> None:
        await self._run(self.lab.stop_training_operator)

    def kill_training_operator(self) -> None:
        self.lab.stop_training_operator(kill=True)

    async def start_training_operator(self) -> None:
        # In this (the main) thread, not a worker: the child's parent-death signal is tied to the
        # thread that forks it (see ControlPlane._spawn). It blocks the loop for ~2 s.
        self.lab.start_training_operator()

    def restore(self) -> None:
        """Undo what this test changed in the shared lab."""
        for name in self._added:
            self.lab.delete_node(name)
        if self._changed_nodes:
            self.lab.restore_nodes()
        if not self.lab.training_operator_running():
            self.lab.start_training_operator()


__all__ = [
    "Kubeflow",
    "pod_name",
    "replica_count",
]

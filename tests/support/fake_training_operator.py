"""A stand-in for Kubeflow's training operator (v1.9, PyTorchJob only), for a bare API server.

It follows the operator's documented behaviour (see the notes' section C and
``pkg/controller.v1/common/job.go``, ``pod.go``, ``pytorchjob_controller.go`` at v1.9):

- a new PyTorchJob gets ``Created``; a suspended one gets ``Suspended=True`` (reason
  ``PyTorchJobSuspended``), its pods deleted and none created;
- unsuspending sets ``Suspended=False`` (``PyTorchJobResumed``) and ``startTime``, and creates the
  pods (``<job>-master-0``, ``<job>-worker-<i>``) with the template's labels plus
  ``training.kubeflow.org/job-name|replica-type|replica-index|operator-name`` and an
  ownerReference to the PyTorchJob; ``Running`` once they run;
- Master succeeded -> ``Succeeded``; a failed replica -> ``Failed`` under restartPolicy Never, and
  under OnFailure the failed pod is deleted, recreated and the job is ``Restarting``; the sum of the
  running pods' restartCounts reaching ``backoffLimit`` (``> 0`` when it is 0) deletes every pod and
  sets ``Failed`` ("... has reached the specified backoff limit");
- ``cleanPodPolicy`` applies once the job has finished.

With no scheduler and no kubelet, it also plays their parts: it binds pods to a fake node through
the ``binding`` subresource and writes their status through ``pods/status`` (phase Running, the
``pytorch`` container running); it completes the deletion of pods that are being deleted (what a
kubelet confirms). The test API ends pods the way Kubernetes would, with real Pod status:
:meth:`succeed`, :meth:`exit`, :meth:`oom`, :meth:`preempt`, :meth:`lose_node`, :meth:`deadline`,
:meth:`image_pull_error`, :meth:`unschedulable`, and :meth:`run` for pods held Pending.

In-process: ``async with FakeTrainingOperator(api) as fake: ...``. As a process:
``python -m tests.support.fake_training_operator --kubeconfig PATH``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Final

from kubernetes_asyncio.client import ApiClient

from dispatch._errors import TransientBackendError
from dispatch._kubeflow._http import MERGE_PATCH, KubeError, request
from dispatch._kubeflow._informer import Informer, key_of

log = logging.getLogger("tests.fake_training_operator")

Body = dict[str, Any]

GROUP: Final = "kubeflow.org"
VERSION: Final = "v1"
PLURAL: Final = "pytorchjobs"
KIND: Final = "PyTorchJob"
CONTAINER: Final = "pytorch"
LABEL_JOB_NAME: Final = "training.kubeflow.org/job-name"
LABEL_REPLICA_TYPE: Final = "training.kubeflow.org/replica-type"
LABEL_REPLICA_INDEX: Final = "training.kubeflow.org/replica-index"
LABEL_OPERATOR: Final = "training.kubeflow.org/operator-name"
LABEL_JOB_ROLE: Final = "training.kubeflow.org/job-role"
OPERATOR_NAME: Final = "pytorchjob-controller"
NODE: Final = "fake-node-0"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _pj_path(namespace: str, name: str | None = None) -> str:
    base = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}"
    return f"{base}/{name}" if name else base


def _pod_path(namespace: str, name: str | None = None) -> str:
    base = f"/api/v1/namespaces/{namespace}/pods"
    return f"{base}/{name}" if name else base


def _true(conditions: list[Body], kind: str) -> bool:
    return any(c.get("type") == kind and c.get("status") == "True" for c in conditions)


def set_condition(conditions: list[Body], kind: str, status: str, reason: str, message: str) -> list[Body]:
    """The training operator's ``UpdateJobConditions``: Running and Restarting replace each other,
    Succeeded/Failed turn Running False, and nothing changes once Failed is set."""
    if _true(conditions, "Failed"):
        return conditions
    now = _now()
    old = next((c for c in conditions if c.get("type") == kind), None)
    if old is not None and old.get("status") == status and old.get("reason") == reason:
        return conditions
    transition = old["lastTransitionTime"] if old is not None and old.get("status") == status else now
    out: list[Body] = []
    for c in conditions:
        if c.get("type") == kind:
            continue
        if {kind, c.get("type")} == {"Running", "Restarting"}:
            continue
        if kind in ("Succeeded", "Failed") and c.get("type") == "Running" and c.get("status") == "True":
            c = {**c, "status": "False", "lastUpdateTime": now, "lastTransitionTime": now}
        out.append(c)
    out.append(
        {
            "type": kind,
            "status": status,
            "reason": reason,
            "message": message,
            "lastUpdateTime": now,
            "lastTransitionTime": transition,
        }
    )
    return out


class FakeTrainingOperator:
    def __init__(self, api: ApiClient, *, auto_run: bool = True, node: str = NODE) -> None:
        """``auto_run=False`` leaves new pods Pending and unbound (see :meth:`run`, :meth:`unschedulable`)."""
        self.api = api
        self.auto_run = auto_run
        self.node = node
        self._locks: dict[str, asyncio.Lock] = {}
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        self.reconciles = 0
        self._jobs = Informer(
            api,
            f"/apis/{GROUP}/{VERSION}/{PLURAL}",
            label_selector="",
            on_change=self._job_changed,
            what="fake: PyTorchJobs",
        )
        self._pods = Informer(
            api,
            "/api/v1/pods",
            label_selector=f"{LABEL_OPERATOR}={OPERATOR_NAME}",
            on_change=self._pod_changed,
            what="fake: pods",
        )

    async def __aenter__(self) -> FakeTrainingOperator:
        await self.start()
        return self

    async def __aexit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        await self.aclose()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._jobs.run()),
            loop.create_task(self._pods.run()),
            loop.create_task(self._work()),
        ]
        await asyncio.wait_for(asyncio.gather(self._jobs.synced.wait(), self._pods.synced.wait()), 60)

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        await asyncio.sleep(0)  # let the aborted watch connections finish closing

    # ---- the controller ---------------------------------------------------------------------

    def _job_changed(self, old: Body | None, new: Body | None) -> None:
        if new is not None:
            self._queue.put_nowait(key_of(new))

    def _pod_changed(self, old: Body | None, new: Body | None) -> None:
        body = new if new is not None else old
        if body is None:
            return
        meta = body["metadata"]
        if new is not None and meta.get("deletionTimestamp"):
            # The kubelet's part: confirm the deletion of a pod being deleted.
            task = asyncio.get_running_loop().create_task(
                self._finish_deletion(meta["namespace"], meta["name"])
            )
            self._tasks.append(task)
        job = (meta.get("labels") or {}).get(LABEL_JOB_NAME)
        if new is None and job:
            self._queue.put_nowait(f"{meta['namespace']}/{job}")

    async def _finish_deletion(self, namespace: str, name: str) -> None:
        with contextlib.suppress(KubeError, TransientBackendError):
            await request(self.api, "DELETE", _pod_path(namespace, name), query={"gracePeriodSeconds": 0})

    async def _work(self) -> None:
        while True:
            key = await self._queue.get()
            try:
                await self.reconcile(*key.split("/", 1))
            except (KubeError, TransientBackendError) as error:
                log.info("reconcile %s: %s; again soon", key, error)
                asyncio.get_running_loop().call_later(0.2, self._queue.put_nowait, key)

    def _lock(self, namespace: str, name: str) -> asyncio.Lock:
        return self._locks.setdefault(f"{namespace}/{name}", asyncio.Lock())

    async def reconcile(self, namespace: str, name: str) -> None:
        async with self._lock(namespace, name):
            await self._reconcile(namespace, name)

    async def _reconcile(self, namespace: str, name: str) -> None:
        self.reconciles += 1
        try:
            job = await request(self.api, "GET", _pj_path(namespace, name))
        except KubeError as error:
            if error.status == 404:
                return
            raise
        spec = job.get("spec", {})
        run_policy = spec.get("runPolicy") or {}
        status = copy.deepcopy(job.get("status") or {})
        before = copy.deepcopy(status)
        conditions: list[Body] = status.get("conditions") or []
        replicas: dict[str, Body] = spec.get("pytorchReplicaSpecs") or {}
        pods = await self._job_pods(namespace, name)

        if not any(c.get("type") == "Created" for c in conditions):
            conditions = set_condition(
                conditions, "Created", "True", "PyTorchJobCreated", f"PyTorchJob {name} is created."
            )

        if _true(conditions, "Succeeded") or _true(conditions, "Failed"):
            policy = run_policy.get("cleanPodPolicy") or "None"
            for pod in pods:
                phase = pod.get("status", {}).get("phase")
                if policy == "All" or (policy == "Running" and phase in ("Running", "Pending")):
                    await self._delete_pod(pod)
        elif run_policy.get("suspend"):
            for pod in pods:
                await self._delete_pod(pod)
            for rs in (status.get("replicaStatuses") or {}).values():
                rs["active"] = 0
            msg = f"PyTorchJob {name} is suspended."
            if _true(conditions, "Running"):
                conditions = set_condition(conditions, "Running", "False", "PyTorchJobSuspended", msg)
            if not _true(conditions, "Suspended"):
                conditions = set_condition(conditions, "Suspended", "True", "PyTorchJobSuspended", msg)
        else:
            if _true(conditions, "Suspended"):
                msg = f"PyTorchJob {name} is resumed."
                conditions = set_condition(conditions, "Suspended", "False", "PyTorchJobResumed", msg)
                status["startTime"] = _now()
            status.setdefault("startTime", _now())
            conditions = await self._run_replicas(job, replicas, pods, conditions, status)

        status["conditions"] = conditions
        if status != before:
            body = {"status": status}
            await request(
                self.api, "PATCH", _pj_path(namespace, name) + "/status", body=body, content_type=MERGE_PATCH
            )

    async def _run_replicas(
        self, job: Body, replicas: dict[str, Body], pods: list[Body], conditions: list[Body], status: Body
    ) -> list[Body]:
        meta = job["metadata"]
        name = meta["name"]
        run_policy = job["spec"].get("runPolicy") or {}
        by_name = {p["metadata"]["name"]: p for p in pods}

        limit = run_policy.get("backoffLimit")
        if limit is not None:
            restarts = 0
            counted = False
            for rtype, rspec in replicas.items():
                if rspec.get("restartPolicy", "OnFailure") not in ("OnFailure", "Always", "ExitCode"):
                    continue
                counted = True
                for pod in pods:
                    labels = pod["metadata"].get("labels") or {}
                    if (
                        labels.get(LABEL_REPLICA_TYPE) != rtype.lower()
                        or pod.get("status", {}).get("phase") != "Running"
                    ):
                        continue
                    restarts += sum(
                        int(cs.get("restartCount") or 0)
                        for cs in pod["status"].get("containerStatuses") or []
                    )
            past = counted and (restarts > 0 if int(limit) == 0 else restarts >= int(limit))
            if past:
                for pod in pods:
                    await self._delete_pod(pod)
                status["completionTime"] = _now()
                msg = f"Job {name} has failed because it has reached the specified backoff limit"
                return set_condition(conditions, "Failed", "True", "PyTorchJobFailed", msg)

        statuses: Body = {}
        for rtype, rspec in replicas.items():
            count = int(rspec.get("replicas", 1))
            policy = rspec.get("restartPolicy", "OnFailure")
            active = succeeded = failed = running = 0
            for index in range(count):
                pod_name = f"{name}-{rtype.lower()}-{index}"
                found = by_name.get(pod_name)
                if found is None:
                    found = await self._create_pod(job, rtype, index, rspec)
                    if found is None:
                        continue
                pod = found
                phase = pod.get("status", {}).get("phase")
                if phase == "Failed" and policy != "Never":
                    await self._delete_pod(pod)  # recreated on the next pass
                    failed += 1
                    continue
                if phase in ("Running", "Pending"):
                    active += 1
                running += phase == "Running"
                succeeded += phase == "Succeeded"
                failed += phase == "Failed"
            statuses[rtype] = {"active": active, "succeeded": succeeded, "failed": failed}
            if rtype == "Master":
                if succeeded == count:
                    status["completionTime"] = _now()
                    msg = f"PyTorchJob {name} is successfully completed."
                    conditions = set_condition(conditions, "Succeeded", "True", "PyTorchJobSucceeded", msg)
                elif running > 0:
                    conditions = set_condition(
                        conditions, "Running", "True", "PyTorchJobRunning", f"PyTorchJob {name} is running."
                    )
            if failed > 0 and count > succeeded + running:
                if policy != "Never":
                    msg = f"PyTorchJob {name} is restarting because {failed} {rtype} replica(s) failed."
                    conditions = set_condition(conditions, "Restarting", "True", "PyTorchJobRestarting", msg)
                else:
                    status["completionTime"] = _now()
                    msg = f"PyTorchJob {name} is failed because {failed} {rtype} replica(s) failed."
                    conditions = set_condition(conditions, "Failed", "True", "PyTorchJobFailed", msg)
        status["replicaStatuses"] = statuses
        return conditions

    async def _job_pods(self, namespace: str, name: str) -> list[Body]:
        listing = await request(
            self.api, "GET", _pod_path(namespace), query={"labelSelector": f"{LABEL_JOB_NAME}={name}"}
        )
        return [p for p in listing.get("items") or [] if not p["metadata"].get("deletionTimestamp")]

    async def _create_pod(self, job: Body, rtype: str, index: int, rspec: Body) -> Body | None:
        meta = job["metadata"]
        template = copy.deepcopy(rspec.get("template") or {})
        labels = dict((template.get("metadata") or {}).get("labels") or {})
        labels.update(
            {
                LABEL_JOB_NAME: meta["name"],
                LABEL_REPLICA_TYPE: rtype.lower(),
                LABEL_REPLICA_INDEX: str(index),
                LABEL_OPERATOR: OPERATOR_NAME,
            }
        )
        if rtype == "Master":
            labels[LABEL_JOB_ROLE] = "master"
        pod_spec = template.get("spec") or {}
        policy = rspec.get("restartPolicy", "OnFailure")
        pod_spec["restartPolicy"] = "Never" if policy == "ExitCode" else policy
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{meta['name']}-{rtype.lower()}-{index}",
                "namespace": meta["namespace"],
                "labels": labels,
                "ownerReferences": [
                    {
                        "apiVersion": f"{GROUP}/{VERSION}",
                        "kind": KIND,
                        "name": meta["name"],
                        "uid": meta["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": pod_spec,
        }
        try:
            created = await request(self.api, "POST", _pod_path(meta["namespace"]), body=pod)
        except KubeError as error:
            if error.status == 409:
                return None
            raise
        if self.auto_run:
            created = await self._bind_and_run(created)
        return created

    async def _delete_pod(self, pod: Body) -> None:
        meta = pod["metadata"]
        with contextlib.suppress(KubeError):
            await request(
                self.api,
                "DELETE",
                _pod_path(meta["namespace"], meta["name"]),
                query={"gracePeriodSeconds": 0},
            )

    # ---- the scheduler's and the kubelet's parts --------------------------------------------

    async def _bind_and_run(self, pod: Body) -> Body:
        meta = pod["metadata"]
        if not pod.get("spec", {}).get("nodeName"):
            binding = {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": meta["name"]},
                "target": {"apiVersion": "v1", "kind": "Node", "name": self.node},
            }
            await request(
                self.api, "POST", _pod_path(meta["namespace"], meta["name"]) + "/binding", body=binding
            )
        now = _now()
        image = pod["spec"]["containers"][0].get("image", "")
        return await self._set_status(
            meta["namespace"],
            meta["name"],
            lambda s: s.update(
                phase="Running",
                hostIP="10.0.0.10",
                podIP="10.1.0.10",
                startTime=now,
                conditions=[
                    {"type": t, "status": "True", "lastTransitionTime": now}
                    for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
                ],
                containerStatuses=[
                    {
                        "name": CONTAINER,
                        "image": image,
                        "imageID": "",
                        "ready": True,
                        "started": True,
                        "restartCount": 0,
                        "state": {"running": {"startedAt": now}},
                    }
                ],
            ),
        )

    async def _set_status(self, namespace: str, name: str, change: Callable[[Body], object]) -> Body:
        for _ in range(10):
            pod = await request(self.api, "GET", _pod_path(namespace, name))
            status = copy.deepcopy(pod.get("status") or {})
            change(status)
            pod["status"] = status
            try:
                return await request(self.api, "PUT", _pod_path(namespace, name) + "/status", body=pod)
            except KubeError as error:
                if error.status != 409:
                    raise
        raise RuntimeError(f"pod {namespace}/{name}: status kept changing")

    # ---- the test API -----------------------------------------------------------------------

    def _pod_name(self, name: str, replica: str, index: int) -> str:
        return f"{name}-{replica.lower()}-{index}"

    async def pods(self, namespace: str, name: str) -> list[Body]:
        return await self._job_pods(namespace, name)

    async def wait_pods(self, namespace: str, name: str, count: int = 1) -> list[Body]:
        """Wait until the job has ``count`` pods, running ones with ``auto_run`` (bound the wait
        with ``asyncio.timeout``)."""
        while True:
            pods = await self._job_pods(namespace, name)
            if self.auto_run:
                pods = [p for p in pods if p.get("status", {}).get("phase") == "Running"]
            if len(pods) >= count:
                return pods
            await asyncio.sleep(0.05)

    async def run(self, namespace: str, name: str) -> None:
        """Bind and start every pod of the job that is still Pending (with ``auto_run=False``)."""
        async with self._lock(namespace, name):
            for pod in await self._job_pods(namespace, name):
                if pod.get("status", {}).get("phase") == "Pending":
                    await self._bind_and_run(pod)
            await self._reconcile(namespace, name)

    async def _container_state(
        self,
        namespace: str,
        name: str,
        replica: str,
        index: int,
        *,
        terminated: Body | None = None,
        phase: str | None = None,
        extra: Callable[[Body], None] | None = None,
    ) -> None:
        pod_name = self._pod_name(name, replica, index)
        pod = await request(self.api, "GET", _pod_path(namespace, pod_name))
        restart_in_place = pod["spec"].get("restartPolicy") in ("OnFailure", "Always")
        now = _now()

        def change(status: Body) -> None:
            for cs in status.get("containerStatuses") or []:
                if cs.get("name") != CONTAINER or terminated is None:
                    continue
                term = {"startedAt": now, "finishedAt": now, **terminated}
                failed = int(terminated.get("exitCode", 0)) != 0
                if restart_in_place and failed and phase is None:
                    cs["restartCount"] = int(cs.get("restartCount") or 0) + 1
                    cs["lastState"] = {"terminated": term}
                    cs["state"] = {"running": {"startedAt": now}}
                else:
                    cs["state"] = {"terminated": term}
                    cs["ready"] = False
                    cs["started"] = False
            if phase is not None:
                status["phase"] = phase
            elif terminated is not None and not restart_in_place:
                status["phase"] = "Succeeded" if int(terminated.get("exitCode", 0)) == 0 else "Failed"
            elif terminated is not None and int(terminated.get("exitCode", 0)) == 0:
                status["phase"] = "Succeeded"
            if status.get("phase") in ("Failed", "Succeeded"):
                for c in status.get("conditions") or []:
                    if c.get("type") in ("Ready", "ContainersReady"):
                        c["status"] = "False"
                        c["lastTransitionTime"] = now
            if extra is not None:
                extra(status)

        async with self._lock(namespace, name):
            await self._set_status(namespace, pod_name, change)
            await self._reconcile(namespace, name)

    async def succeed(self, namespace: str, name: str) -> None:
        """Every pod's program exits 0 (workers first, then the master)."""
        pods = await self._job_pods(namespace, name)
        pods.sort(
            key=lambda p: (p["metadata"]["labels"].get(LABEL_REPLICA_TYPE) == "master", p["metadata"]["name"])
        )
        for pod in pods:
            labels = pod["metadata"]["labels"]
            await self._container_state(
                namespace,
                name,
                labels[LABEL_REPLICA_TYPE],
                int(labels[LABEL_REPLICA_INDEX]),
                terminated={"exitCode": 0, "reason": "Completed"},
            )

    async def exit(
        self,
        namespace: str,
        name: str,
        code: int,
        replica: str = "master",
        index: int = 0,
        *,
        reason: str = "Error",
    ) -> None:
        """The program exits with ``code``; under OnFailure the kubelet restarts it in place."""
        await self._container_state(
            namespace, name, replica, index, terminated={"exitCode": code, "reason": reason}
        )

    async def oom(self, namespace: str, name: str, replica: str = "master", index: int = 0) -> None:
        await self.exit(namespace, name, 137, replica, index, reason="OOMKilled")

    async def _disrupt(
        self,
        namespace: str,
        name: str,
        replica: str,
        index: int,
        reason: str,
        message: str,
        *,
        exit_code: int | None,
    ) -> None:
        now = _now()

        def extra(status: Body) -> None:
            conditions = [c for c in status.get("conditions") or [] if c.get("type") != "DisruptionTarget"]
            conditions.append(
                {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": reason,
                    "message": message,
                    "lastTransitionTime": now,
                }
            )
            status["conditions"] = conditions

        terminated = {"exitCode": exit_code, "reason": "Error"} if exit_code is not None else None
        await self._container_state(
            namespace, name, replica, index, terminated=terminated, phase="Failed", extra=extra
        )

    async def preempt(
        self,
        namespace: str,
        name: str,
        replica: str = "master",
        index: int = 0,
        *,
        reason: str = "PreemptionByScheduler",
        exit_code: int = 137,
    ) -> None:
        message = {
            "EvictionByEvictionAPI": "Eviction API: evicting",
        }.get(reason, "fake-scheduler: preempting to accommodate a higher priority pod")
        await self._disrupt(namespace, name, replica, index, reason, message, exit_code=exit_code)

    async def lose_node(
        self,
        namespace: str,
        name: str,
        replica: str = "master",
        index: int = 0,
        *,
        reason: str = "DeletionByTaintManager",
    ) -> None:
        """The pod's node goes away (there is no Node object for the fake node at all)."""
        message = {
            "TerminationByKubelet": "Pod was terminated in response to imminent node shutdown.",
            "DeletionByPodGC": "PodGC: node no longer exists",
        }.get(reason, "Taint manager: deleting due to NoExecute taint")
        await self._disrupt(namespace, name, replica, index, reason, message, exit_code=None)

    async def deadline(self, namespace: str, name: str, replica: str = "master", index: int = 0) -> None:
        """The pod's activeDeadlineSeconds passed: the kubelet kills it, reason DeadlineExceeded."""

        def extra(status: Body) -> None:
            status["reason"] = "DeadlineExceeded"
            status["message"] = "Pod was active on the node longer than the specified deadline"

        await self._container_state(
            namespace,
            name,
            replica,
            index,
            terminated={"exitCode": 137, "reason": "Error"},
            phase="Failed",
            extra=extra,
        )

    async def image_pull_error(
        self,
        namespace: str,
        name: str,
        replica: str = "master",
        index: int = 0,
        *,
        reason: str = "ErrImagePull",
    ) -> None:
        """The image cannot be pulled: the pod stays Pending, the container waiting."""
        pod_name = self._pod_name(name, replica, index)
        now = _now()

        def change(status: Body) -> None:
            status["phase"] = "Pending"
            for c in status.get("conditions") or []:
                if c.get("type") in ("Ready", "ContainersReady"):
                    c["status"] = "False"
                    c["lastTransitionTime"] = now
            for cs in status.get("containerStatuses") or []:
                cs["ready"] = False
                cs["started"] = False
                cs["state"] = {
                    "waiting": {
                        "reason": reason,
                        "message": f'failed to pull image "{cs.get("image")}": not found',
                    }
                }

        async with self._lock(namespace, name):
            pod = await request(self.api, "GET", _pod_path(namespace, pod_name))
            if not pod.get("spec", {}).get("nodeName"):
                await self._bind_and_run(pod)
            await self._set_status(namespace, pod_name, change)
            await self._reconcile(namespace, name)

    async def unschedulable(self, namespace: str, name: str, replica: str = "master", index: int = 0) -> None:
        """The scheduler finds no node for the (unbound) pod."""
        pod_name = self._pod_name(name, replica, index)
        now = _now()

        def change(status: Body) -> None:
            status["phase"] = "Pending"
            status["conditions"] = [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/1 nodes are available: 1 Insufficient nvidia.com/gpu.",
                    "lastTransitionTime": now,
                }
            ]

        async with self._lock(namespace, name):
            await self._set_status(namespace, pod_name, change)
            await self._reconcile(namespace, name)


async def _main(kubeconfig: str | None, auto_run: bool) -> None:
    from dispatch._kubeapi import new_client

    api = await new_client(kubeconfig)
    async with api, FakeTrainingOperator(api, auto_run=auto_run):
        log.info("fake training operator running")
        await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--kubeconfig", default=None)
    parser.add_argument("--no-auto-run", action="store_true", help="leave new pods Pending")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main(args.kubeconfig, not args.no_auto_run))


if __name__ == "__main__":
    main()


# ---- helpers for tests ------------------------------------------------------------------------

CRD_FILE: Final = Path(__file__).parent / "crds" / "pytorchjob.yaml"


def install_crds(kube_cluster: Any) -> None:
    """Apply the PyTorchJob CRD and dispatch's DispatchJob CRD; wait until both are established."""
    from tests.support.controlplane import REPO_ROOT

    kube_cluster.apply(CRD_FILE)
    kube_cluster.apply(REPO_ROOT / "crds" / "dispatch.dev_dispatchjobs.yaml")
    for crd in ("pytorchjobs.kubeflow.org", "dispatchjobs.dispatch.dev"):
        kube_cluster.wait_for_condition("crd", crd, None, "Established", timeout=60)


def owner_manifest(namespace: str, name: str, image: str = "example.invalid/train:1") -> Body:
    """A DispatchJob to own the PyTorchJobs of a test (no operator runs for it)."""
    return {
        "apiVersion": "dispatch.dev/v1alpha1",
        "kind": "DispatchJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"backend": "kubeflow", "command": ["python", "train.py"], "kubeflow": {"image": image}},
    }

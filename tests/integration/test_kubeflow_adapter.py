"""The Kubeflow adapter on the lab: the real training operator (controller and webhook),
kube-scheduler, kube-controller-manager, and kwok playing the kubelet.

Run: ``.venv/bin/pytest tests/integration/test_kubeflow_adapter.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient

from dispatch import (
    Action,
    CauseKind,
    ObjectExists,
    Phase,
    Rule,
    make_plan,
)
from dispatch._backends.kubeflow._adapter import CAPABILITIES, KubeflowBackend
from dispatch._kubeclient import JSON_PATCH, MERGE_PATCH, Informer, KubeError, new_client, request
from dispatch._workload._release import release_ops
from tests.support.builders import identity
from tests.support.kube import KubeCluster
from tests.support.kubeflow_adapter import (
    GUARD,
    PJ,
    create_owner,
    eventually,
    get_pj,
    phase_is,
    pods_of,
    spec_of,
    until,
)
from tests.support.lab import NODE_GPU, UNPULLABLE_IMAGE, WEBHOOK_NAME, Kubeflow

pytestmark = pytest.mark.integration


@pytest.fixture
async def backend(api: ApiClient) -> AsyncIterator[KubeflowBackend]:
    adapter = KubeflowBackend(api)
    try:
        yield adapter
    finally:
        await adapter.aclose()


async def no_pods(api: ApiClient, object_id: str) -> bool:
    return not await pods_of(api, object_id)


async def stopped_by_dispatch(api: ApiClient, object_id: str) -> bool:
    pj = await get_pj(api, object_id)
    assert pj is not None
    annotations = pj["metadata"].get("annotations") or {}
    return bool(pj["spec"]["runPolicy"]["suspend"]) and "dispatch.dev/ended" in annotations


async def finished_or_stopped(api: ApiClient, object_id: str) -> bool:
    pj = await get_pj(api, object_id)
    assert pj is not None
    conditions = {c["type"]: c["status"] for c in pj.get("status", {}).get("conditions", [])}
    return conditions.get("Failed") == "True" or await stopped_by_dispatch(api, object_id)


async def none_running_or_all_deleting(api: ApiClient, object_id: str) -> bool:
    return all(
        p["metadata"].get("deletionTimestamp") or p.get("status", {}).get("phase") != "Running"
        for p in await pods_of(api, object_id)
    )


async def none_running(api: ApiClient, object_id: str) -> bool:
    return not any(p.get("status", {}).get("phase") == "Running" for p in await pods_of(api, object_id))


async def test_create_held_release_run_succeed_end(
    kube_cluster: KubeCluster,
    namespace: str,
    api: ApiClient,
    kubeflow: Kubeflow,
    backend: KubeflowBackend,
) -> None:
    job = await create_owner(kube_cluster, namespace, "train")
    spec = spec_of("train", nodes=3)
    plan = make_plan(job, spec, CAPABILITIES, supervised=True)

    oid = await backend.create(job, 1, spec, plan)
    assert oid == f"{namespace}/train-1"
    views = await backend.list(job)  # at once: our own creation is shown before the watch brings it
    assert [(v.id, v.submission, v.phase) for v in views] == [(oid, 1, Phase.HELD)]
    with pytest.raises(ObjectExists):
        await backend.create(job, 1, spec, plan)

    pj = await get_pj(api, oid)
    assert pj is not None
    meta, pj_spec = pj["metadata"], pj["spec"]
    assert meta["labels"] == {
        "dispatch.dev/job": "train",
        "dispatch.dev/submission": "1",
        "app.kubernetes.io/managed-by": "dispatch",
    }
    owner = await request(
        api, "GET", f"/apis/dispatch.dev/v1alpha1/namespaces/{namespace}/dispatchjobs/train"
    )
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "dispatch.dev/v1alpha1",
            "kind": "DispatchJob",
            "name": "train",
            "uid": owner["metadata"]["uid"],
            "controller": True,
        }
    ]
    # No backoffLimit under Never: with one (even 0) the training operator deletes the failed pod too.
    assert pj_spec["runPolicy"] == {"suspend": True, "cleanPodPolicy": "Running"}
    replicas = pj_spec["pytorchReplicaSpecs"]
    assert (replicas["Master"]["replicas"], replicas["Worker"]["replicas"]) == (1, 2)
    for replica in replicas.values():
        assert replica["restartPolicy"] == "Never"
        (container,) = replica["template"]["spec"]["containers"]
        assert container["name"] == "pytorch"
        assert container["image"] == "example.invalid/train:1"
        assert container["command"] == ["python", "train.py", "--epochs", "3"]
        assert container["env"] == [
            *identity(namespace, "train", 1),
            {"name": "WANDB_MODE", "value": "offline"},
        ]
        assert container["resources"]["limits"] == {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "1"}

    # The training operator marks it suspended and creates no pods.
    async with asyncio.timeout(GUARD):
        while True:
            pj = await get_pj(api, oid)
            assert pj is not None
            conditions = {c["type"]: c for c in pj.get("status", {}).get("conditions", [])}
            if conditions.get("Suspended", {}).get("status") == "True":
                break
            await asyncio.sleep(0.05)
    assert conditions["Suspended"]["reason"] == "PyTorchJobSuspended"
    assert await pods_of(api, oid) == []
    assert [v.phase for v in await backend.list(job)] == [Phase.HELD]

    await backend.release(oid)
    await backend.release(oid)  # safe to repeat
    views = await until(backend, job, phase_is(oid, Phase.RUNNING))
    async with asyncio.timeout(GUARD):
        pods = await kubeflow.wait_pods(namespace, "train-1", 3)
    assert sorted(p["metadata"]["name"] for p in pods) == [
        "train-1-master-0",
        "train-1-worker-0",
        "train-1-worker-1",
    ]
    assert all(p["metadata"]["labels"]["dispatch.dev/job"] == "train" for p in pods)

    await kubeflow.succeed(namespace, "train-1")
    views = await until(backend, job, phase_is(oid, Phase.ENDED))
    (view,) = views
    assert view.cause is not None
    assert view.cause.kind is CauseKind.NONE
    assert not view.cancelled

    # A new adapter (a restarted process) finds the object by its labels.
    async with await new_client(str(kube_cluster.kubeconfig)) as other_api:
        other = KubeflowBackend(other_api)
        try:
            again = await other.list(job)
        finally:
            await other.aclose()
    assert [(v.id, v.phase, v.cause) for v in again] == [(view.id, view.phase, view.cause)]

    await backend.end(oid)
    await backend.end(oid)  # ending an ended or vanished object is fine
    assert await get_pj(api, oid) is None
    await eventually(lambda: no_pods(api, oid))
    (gone,) = await backend.list(job)
    assert gone.phase is Phase.ENDED
    assert gone.cause is not None
    assert gone.cause.kind is CauseKind.NONE


async def test_release_waits_queued_without_running_pods(
    kube_cluster: KubeCluster, namespace: str, api: ApiClient, backend: KubeflowBackend, kubeflow: Kubeflow
) -> None:
    """More GPUs than any node has: kube-scheduler leaves the pods Pending (Unschedulable); a
    bigger node arrives and they run."""
    job = await create_owner(kube_cluster, namespace, "queued")
    spec = spec_of("queued", gpu=NODE_GPU + 1)
    oid = await backend.create(job, 1, spec, make_plan(job, spec, CAPABILITIES, supervised=True))
    await backend.release(oid)
    await until(backend, job, lambda vs: len(vs) == 1 and vs[0].phase is Phase.QUEUED)
    await eventually(lambda: has_pods(api, oid))
    assert [v.phase for v in await backend.list(job)] == [Phase.QUEUED]
    # Unschedulable for a few seconds: the backend wakes the job to say why (no watch event does).
    [waiting] = await until(backend, job, lambda vs: len(vs) == 1 and bool(vs[0].waiting))
    assert waiting.phase is Phase.QUEUED
    assert waiting.waiting.startswith(f"pod {oid.split('/')[1]}-"), waiting.waiting
    assert "Insufficient nvidia.com/gpu" in waiting.waiting, waiting.waiting
    await kubeflow.add_node(gpu=2 * NODE_GPU)
    [running] = await until(backend, job, phase_is(oid, Phase.RUNNING))
    assert running.waiting == ""


async def has_pods(api: ApiClient, object_id: str) -> bool:
    return bool(await pods_of(api, object_id))


ANY = -1
"""Expected exit code: not checked (the mechanism acts on the whole node, or the exit code is
whatever the kubelet's kill gives)."""

CASES: dict[str, tuple[str, dict[str, Any], CauseKind, int | None]] = {
    # real kube-scheduler preemption (a lab-high pod needing the whole node): every pod there goes
    "preempted-by-scheduler": ("preempt", {}, CauseKind.PREEMPTED, ANY),
    "evicted-by-api": ("evict", {}, CauseKind.PREEMPTED, ANY),
    # kube-controller-manager's taint eviction; pod GC after the Node is deleted; node-lifecycle
    "node-lost-taint": ("taint_evict", {}, CauseKind.NODE_LOST, ANY),
    "node-lost-podgc": ("delete_node", {}, CauseKind.NODE_LOST, ANY),
    "node-lost-not-ready": ("node_not_ready", {}, CauseKind.NODE_LOST, ANY),
    # what the kubelet reports (kwok stages)
    "node-lost-kubelet": ("node_shutdown", {}, CauseKind.NODE_LOST, ANY),
    "out-of-memory": ("oom", {}, CauseKind.OUT_OF_MEMORY, 137),
    "non-zero-exit": ("exit", {"code": 3}, CauseKind.NON_ZERO_EXIT, 3),
    "deadline": ("deadline", {}, CauseKind.TIME_LIMIT, 137),
    "image-pull-backoff": ("waiting", {"reason": "ImagePullBackOff"}, CauseKind.LAUNCH_FAILED, None),
    "config-error": ("waiting", {"reason": "CreateContainerConfigError"}, CauseKind.LAUNCH_FAILED, None),
}
NODE_WIDE = {"preempt", "taint_evict", "delete_node", "node_not_ready"}


@pytest.mark.parametrize("case", list(CASES))
async def test_cause_is_classified(
    kube_cluster: KubeCluster,
    namespace: str,
    api: ApiClient,
    kubeflow: Kubeflow,
    backend: KubeflowBackend,
    case: str,
) -> None:
    method, kwargs, kind, exit_code = CASES[case]
    job = await create_owner(kube_cluster, namespace, "cause")
    spec = spec_of("cause", nodes=2)
    oid = await backend.create(job, 1, spec, make_plan(job, spec, CAPABILITIES, supervised=True))
    await backend.release(oid)
    await until(backend, job, phase_is(oid, Phase.RUNNING))
    async with asyncio.timeout(GUARD):
        await kubeflow.wait_pods(namespace, "cause-1", 2)

    await getattr(kubeflow, method)(namespace, "cause-1", replica="worker", index=0, **kwargs)
    (view,) = await until(backend, job, phase_is(oid, Phase.ENDED))
    assert view.cause is not None
    assert view.cause.kind is kind, view.cause
    if exit_code != ANY:
        assert view.cause.exit_code == exit_code, view.cause
    # A node-wide mechanism may hit the master too (both pods can share the node).
    assert ("cause-1-" if method in NODE_WIDE else "cause-1-worker-0") in view.cause.detail, view.cause
    assert not view.cancelled

    # Nothing of it runs on: the training operator failed it, or the adapter stopped it (in the
    # background: the object is reported ended as soon as the evidence is seen).
    await eventually(lambda: finished_or_stopped(api, oid))
    if method == "node_not_ready":
        # Nobody can kill a pod on a lost node: its phase stays Running until the node returns or
        # is deleted; what the API server can say is that every such pod is being deleted.
        await eventually(lambda: none_running_or_all_deleting(api, oid))
    else:
        await eventually(lambda: none_running(api, oid))
    # The cause survives a restart of the adapter.
    async with await new_client(str(kube_cluster.kubeconfig)) as other_api:
        other = KubeflowBackend(other_api)
        try:
            (again,) = await other.list(job)
        finally:
            await other.aclose()
    assert again.phase is Phase.ENDED
    assert again.cause is not None
    assert again.cause.kind is kind


async def test_no_capacity_after_the_configured_wait(
    kube_cluster: KubeCluster, namespace: str, api: ApiClient, backend: KubeflowBackend
) -> None:
    job = await create_owner(kube_cluster, namespace, "full")
    spec = spec_of("full", gpu=NODE_GPU + 1, no_capacity_after_seconds=1)  # kube-scheduler: Unschedulable
    oid = await backend.create(job, 1, spec, make_plan(job, spec, CAPABILITIES, supervised=True))
    await backend.release(oid)
    # Nothing changes on the API server when the wait is over: the adapter's own timer wakes us.
    (view,) = await until(backend, job, phase_is(oid, Phase.ENDED))
    assert view.cause is not None
    assert view.cause.kind is CauseKind.NO_CAPACITY, view.cause
    # The training operator would keep the pod waiting: the adapter stops the PyTorchJob itself.
    # list() shows it ended while the stop is in flight; settling waits for it (quiesce).
    await backend.quiesce(job)
    assert await stopped_by_dispatch(api, oid)


async def test_image_that_cannot_be_pulled_is_launch_failed(
    kube_cluster: KubeCluster, namespace: str, api: ApiClient, backend: KubeflowBackend
) -> None:
    """The kubelet (kwok) cannot pull the image: pods Pending, containers waiting ErrImagePull."""
    job = await create_owner(kube_cluster, namespace, "nopull")
    spec = spec_of("nopull", image=UNPULLABLE_IMAGE)
    oid = await backend.create(job, 1, spec, make_plan(job, spec, CAPABILITIES, supervised=True))
    await backend.release(oid)
    (view,) = await until(backend, job, phase_is(oid, Phase.ENDED))
    assert view.cause is not None
    assert view.cause.kind is CauseKind.LAUNCH_FAILED, view.cause
    assert "ErrImagePull" in view.cause.detail, view.cause
    await eventually(lambda: finished_or_stopped(api, oid))


async def test_scheduler_enforced_restart_rule(
    kube_cluster: KubeCluster,
    namespace: str,
    api: ApiClient,
    kubeflow: Kubeflow,
    backend: KubeflowBackend,
) -> None:
    job = await create_owner(kube_cluster, namespace, "restart")
    rule = Rule(on=(CauseKind.NON_ZERO_EXIT, CauseKind.OUT_OF_MEMORY), action=Action.RESTART, budget=2)
    spec = spec_of("restart", rules=[rule])
    plan = make_plan(job, spec, CAPABILITIES, supervised=True)
    assert plan.rules[0].enforcer == "scheduler"
    oid = await backend.create(job, 1, spec, plan)
    pj = await get_pj(api, oid)
    assert pj is not None
    assert pj["spec"]["pytorchReplicaSpecs"]["Master"]["restartPolicy"] == "OnFailure"
    # budget 2 = two whole restarts: the operator fails the job when restarts reach backoffLimit.
    assert pj["spec"]["runPolicy"]["backoffLimit"] == 3

    await backend.release(oid)
    await until(backend, job, phase_is(oid, Phase.RUNNING))
    await kubeflow.wait_pods(namespace, "restart-1", 1)
    await kubeflow.oom(namespace, "restart-1")
    (view,) = await until(backend, job, lambda vs: vs[0].restarts == 1)
    assert view.phase is Phase.RUNNING
    await kubeflow.exit(namespace, "restart-1", 1)
    (view,) = await until(backend, job, lambda vs: vs[0].restarts == 2)
    assert view.phase is Phase.RUNNING
    await kubeflow.exit(namespace, "restart-1", 2)  # the third failure: budget spent
    (view,) = await until(backend, job, phase_is(oid, Phase.ENDED))
    assert view.restarts == 2
    assert view.cause is not None
    assert view.cause.kind is CauseKind.NON_ZERO_EXIT
    assert view.cause.exit_code == 2


async def test_a_lost_backoff_decision_does_not_run_the_job_again(
    kube_cluster: KubeCluster, namespace: str, api: ApiClient, kubeflow: Kubeflow
) -> None:
    """The training operator deletes the pods at the backoff limit, then writes Failed; when that
    write is lost, its next pass sees no restarts (the pods are gone) and creates them anew: a run
    the rule does not allow (a CI run waited on such a job in vain). Here the training operator is
    down when the third failure comes and the pods are deleted as it deletes them: started again,
    the real one creates new pods. The adapter counted the restarts of every incarnation: it ends
    the object at the third failure and, after its grace, stops it (which deletes the new pods)."""
    # Long enough for the training operator to start and create the pods again before the stop.
    backend = KubeflowBackend(api, stop_grace=30.0)
    try:
        job = await create_owner(kube_cluster, namespace, "lost")
        rule = Rule(on=(CauseKind.NON_ZERO_EXIT, CauseKind.OUT_OF_MEMORY), action=Action.RESTART, budget=2)
        spec = spec_of("lost", rules=[rule])
        oid = await backend.create(job, 1, spec, make_plan(job, spec, CAPABILITIES, supervised=True))
        await backend.release(oid)
        await until(backend, job, phase_is(oid, Phase.RUNNING))
        await kubeflow.wait_pods(namespace, "lost-1", 1)
        await kubeflow.exit(namespace, "lost-1", 1)
        await until(backend, job, lambda vs: vs[0].restarts == 1)
        await kubeflow.exit(namespace, "lost-1", 2)
        await until(backend, job, lambda vs: vs[0].restarts == 2)

        await kubeflow.stop_training_operator()
        await kubeflow.exit(namespace, "lost-1", 3)  # the third failure: past the budget
        (view,) = await until(backend, job, phase_is(oid, Phase.ENDED))
        assert view.restarts == 2
        assert view.cause is not None
        assert view.cause.kind is CauseKind.NON_ZERO_EXIT
        assert view.cause.exit_code == 3
        (pod,) = await pods_of(api, oid)
        await kubeflow.delete_pod(namespace, pod["metadata"]["name"], grace_seconds=0)
        await eventually(lambda: no_pods(api, oid))
        await kubeflow.start_training_operator()
        async with asyncio.timeout(GUARD):
            (again,) = await kubeflow.wait_pods(namespace, "lost-1", 1)  # the lost decision's new run
        assert again["metadata"]["uid"] != pod["metadata"]["uid"]

        await eventually(lambda: stopped_by_dispatch(api, oid))
        await eventually(lambda: none_running_or_all_deleting(api, oid))
        (view,) = await backend.list(job)
        assert view.phase is Phase.ENDED
        assert view.cause is not None
        assert view.cause.exit_code == 3
    finally:
        await backend.aclose()


async def test_deleted_by_someone_is_cancelled(
    kube_cluster: KubeCluster,
    namespace: str,
    api: ApiClient,
    backend: KubeflowBackend,
) -> None:
    job = await create_owner(kube_cluster, namespace, "gone")
    spec = spec_of("gone")
    oid = await backend.create(job, 1, spec, make_plan(job, spec, CAPABILITIES, supervised=True))
    await backend.release(oid)
    await until(backend, job, phase_is(oid, Phase.RUNNING))
    # dispatch's finalizer keeps it (deletionTimestamp set) until dispatch has read how it ended
    kube_cluster.kubectl("delete", "pytorchjob", "gone-1", f"--namespace={namespace}", "--wait=false")
    (view,) = await until(backend, job, phase_is(oid, Phase.ENDED))
    assert view.cancelled
    assert view.retained
    await backend.end(oid)  # what the supervisor does once the record has it: lets it go
    (view,) = await backend.list(job)
    assert view.phase is Phase.ENDED
    assert view.cancelled
    assert not view.retained
    kube_cluster.kubectl(
        "wait", "pytorchjob/gone-1", f"--namespace={namespace}", "--for=delete", "--timeout=30s"
    )  # gone once dispatch let go of it


async def test_release_stops_the_older_objects_of_the_job_first(
    kube_cluster: KubeCluster,
    namespace: str,
    api: ApiClient,
) -> None:
    """The fence: submission 1 still runs on the API server (a crash after the failure was seen
    and the next submission authorized, before the stop landed; evidence lost). Releasing
    submission 2 stops submission 1 first, in that order on the API server."""
    job = await create_owner(kube_cluster, namespace, "fence")
    spec = spec_of("fence")
    plan = make_plan(job, spec, CAPABILITIES, supervised=True)
    order: list[tuple[str, bool, bool]] = []
    released = asyncio.Event()

    def record(old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if new is not None:
            name = new["metadata"]["name"]
            stopped = "dispatch.dev/ended" in (new["metadata"].get("annotations") or {})
            suspended = bool(new["spec"]["runPolicy"].get("suspend"))
            order.append((name, suspended, stopped))
            if name == "fence-2" and not suspended:
                released.set()

    watch = Informer(api, PJ.format(ns=namespace), label_selector="", on_change=record, what="test")
    watching = asyncio.create_task(watch.run())
    # A read-only adapter stops nothing by itself: only the fence can stop submission 1.
    backend = KubeflowBackend(api, stop_ended=False)
    try:
        first = await backend.create(job, 1, spec, plan)
        await backend.release(first)
        await until(backend, job, phase_is(first, Phase.RUNNING))
        second = await backend.create(job, 2, spec, plan)
        await backend.release(second)
        # When release returns, submission 1 is stopped on the API server for good.
        pj = await get_pj(api, first)
        assert pj is not None
        assert pj["spec"]["runPolicy"]["suspend"] is True
        ended = pj["metadata"]["annotations"]["dispatch.dev/ended"]
        assert "stopped by dispatch before submission 2" in ended
        views = await until(backend, job, phase_is(second, Phase.RUNNING))
        assert [v.phase for v in views] == [Phase.ENDED, Phase.RUNNING]
        async with asyncio.timeout(GUARD):
            await released.wait()
    finally:
        await backend.aclose()
        watching.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watching
    # The watch shows the API server's order: fence-1 stopped before fence-2 was unsuspended.
    stopped_at = next(i for i, (name, _, stopped) in enumerate(order) if name == "fence-1" and stopped)
    released_at = next(
        i for i, (name, suspended, _) in enumerate(order) if name == "fence-2" and not suspended
    )
    assert stopped_at < released_at, order


@contextlib.contextmanager
def webhook_ignored(cluster: KubeCluster) -> Iterator[None]:
    """The training operator's validating webhook with ``failurePolicy: Ignore`` meanwhile."""

    def policy(value: str) -> None:
        ops = [{"op": "replace", "path": "/webhooks/0/failurePolicy", "value": value}]
        cluster.kubectl(
            "patch", "validatingwebhookconfiguration", WEBHOOK_NAME, "--type=json", f"-p={json.dumps(ops)}"
        )

    policy("Ignore")
    try:
        yield
    finally:
        policy("Fail")


async def test_pods_a_stopped_objects_controller_leaves_running_are_deleted_by_dispatch(
    kube_cluster: KubeCluster, namespace: str, api: ApiClient, kubeflow: Kubeflow
) -> None:
    """The training operator deletes a suspended PyTorchJob's pods; while it is down they run on,
    and ``pod_cleanup_after`` a stop dispatch deletes them itself, each by name (a DELETE by label
    selector scans every pod of the namespace on the API server)."""
    backend = KubeflowBackend(api, stop_ended=False, pod_cleanup_after=1.0)
    deletes: list[str] = []
    real = backend.api.call_api

    async def spy(path: str, method: str, *args: Any, **kwargs: Any) -> Any:
        if method == "DELETE" and "/pods" in path:
            deletes.append(path)
        return await real(path, method, *args, **kwargs)

    backend.api.call_api = spy  # type: ignore[method-assign,assignment]
    try:
        job = await create_owner(kube_cluster, namespace, "left")
        spec = spec_of("left", nodes=2)
        plan = make_plan(job, spec, CAPABILITIES, supervised=True)
        first = await backend.create(job, 1, spec, plan)
        await backend.release(first)
        await until(backend, job, phase_is(first, Phase.RUNNING))
        pods = await kubeflow.wait_pods(namespace, "left-1", 2)
        second = await backend.create(job, 2, spec, plan)
        # A stuck controller: stopped (the fixture's restore starts it again), its webhook ignored
        # meanwhile (the API server would refuse every write on a PyTorchJob without it).
        await kubeflow.stop_training_operator()
        with webhook_ignored(kube_cluster):
            await backend.release(second)  # stops submission 1 first: nobody deletes its pods but us
            await eventually(lambda: none_running_or_all_deleting(api, first))
        names = sorted(p["metadata"]["name"] for p in pods)
        assert sorted(path.rsplit("/", 1)[-1] for path in deletes) == names, deletes
        assert all(path.startswith(f"/api/v1/namespaces/{namespace}/pods/") for path in deletes), deletes
    finally:
        await backend.aclose()
        vars(api).pop("call_api", None)  # the spy goes: the class's method again


async def test_a_stop_before_a_resubmission_is_off_the_path_until_settling(
    kube_cluster: KubeCluster,
    namespace: str,
    api: ApiClient,
    kubeflow: Kubeflow,
    backend: KubeflowBackend,
) -> None:
    """An image that no longer pulls, with a rule that resubmits on launch-failed: the object is
    reported ended at once and by every list() after (the supervisor authorizes and creates the
    next submission meanwhile); quiesce() (before settling) returns once the stop has landed."""
    job = await create_owner(kube_cluster, namespace, "pull")
    rule = Rule(on=(CauseKind.LAUNCH_FAILED,), action=Action.RESUBMIT, budget=1)
    spec = spec_of("pull", rules=[rule])
    oid = await backend.create(job, 1, spec, make_plan(job, spec, CAPABILITIES, supervised=True))
    await backend.release(oid)
    await until(backend, job, phase_is(oid, Phase.RUNNING))
    await kubeflow.wait_pods(namespace, "pull-1", 1)
    await kubeflow.waiting(namespace, "pull-1", "ErrImagePull", "failed to pull image: not found")
    (view,) = await until(backend, job, phase_is(oid, Phase.ENDED))
    assert view.cause is not None
    assert view.cause.kind is CauseKind.LAUNCH_FAILED
    (again,) = await backend.list(job)
    assert again.cause == view.cause
    await backend.quiesce(job)
    assert await stopped_by_dispatch(api, oid)
    pj = await get_pj(api, oid)
    assert pj is not None
    assert json.loads(pj["metadata"]["annotations"]["dispatch.dev/ended"])["kind"] == "launch-failed"


async def test_a_canonical_the_watch_has_not_shown_yet_is_confirmed_on_the_api_server(
    kube_cluster: KubeCluster, namespace: str, api: ApiClient, backend: KubeflowBackend
) -> None:
    """Two processes: B's watch cache has not seen A's create yet (frozen here, so the lag is
    certain). B's listing lacks the object; ``confirm`` looks it up and shows it, so a supervisor
    in B never records a canonical that exists as vanished."""
    job = await create_owner(kube_cluster, namespace, "lag")
    other = KubeflowBackend(api)
    try:
        assert await other.list(job) == []  # synced
        for task in other.watches.tasks:  # freeze B's cache: its watches see nothing from now on
            task.cancel()
        await asyncio.gather(*other.watches.tasks, return_exceptions=True)
        spec = spec_of("lag")
        oid = await backend.create(job, 1, spec, make_plan(job, spec, CAPABILITIES, supervised=True))
        await backend.release(oid)
        assert await other.list(job) == []
        (view,) = await other.confirm(job, oid)
        assert view.id == oid
        assert view.phase is not Phase.ENDED
        assert [v.id for v in await other.list(job)] == [oid]  # kept until the watch brings it
        assert [v.id for v in await other.confirm(job, f"{namespace}/lag-9")] == [oid]  # absent: no view
    finally:
        await other.aclose()


async def test_the_release_tests_what_it_must_not_undo_not_the_resource_version(
    kube_cluster: KubeCluster,
    namespace: str,
    api: ApiClient,
    backend: KubeflowBackend,
) -> None:
    """The release's JSON patch (_workload/_release.py) on the real API server: a write after the
    read (the training operator's status update right after the create, here a label) no longer
    fails it, where the merge patch conditional on that resourceVersion gets 409; a stop that
    landed after the read (``dispatch.dev/ended``) or a deletion makes it fail with 422 and leaves
    the object held; an object read without annotations is released, unless a stop added some."""
    job = await create_owner(kube_cluster, namespace, "cond")
    spec = spec_of("cond")
    plan = make_plan(job, spec, CAPABILITIES, supervised=True)
    kind = backend.kind
    now = "2026-12-01T00:00:00+00:00"

    async def created(n: int) -> tuple[str, dict[str, Any]]:
        oid = await backend.create(job, n, spec, plan)
        path = f"{PJ.format(ns=namespace)}/{oid.split('/')[1]}"
        return path, await request(api, "GET", path)

    async def write_after_read(path: str, patch: dict[str, Any]) -> None:
        await request(api, "PATCH", path, body=patch, content_type=MERGE_PATCH)

    async def held(path: str) -> bool:
        return bool((await request(api, "GET", path))["spec"]["runPolicy"].get("suspend"))

    async def refused(read: dict[str, Any], path: str) -> None:
        with pytest.raises(KubeError) as refusal:
            await request(api, "PATCH", path, body=release_ops(kind, read, now), content_type=JSON_PATCH)
        assert refusal.value.status == 422
        assert await held(path)

    async def stopped_since(read: dict[str, Any], path: str) -> None:
        stop = {"metadata": {"annotations": {"dispatch.dev/ended": '{"kind": "preempted"}'}}}
        await write_after_read(path, stop)
        await refused(read, path)

    # 1. A write after the read: the old precondition fails, the tests pass.
    path, read = await created(1)
    await write_after_read(path, {"metadata": {"labels": {"lab.dispatch.io/touched": "yes"}}})
    merge = {
        **kind.suspend_patch(False),
        "metadata": {"resourceVersion": read["metadata"]["resourceVersion"]},
    }
    with pytest.raises(KubeError) as conflict:
        await request(api, "PATCH", path, body=merge, content_type=MERGE_PATCH)
    assert conflict.value.status == 409
    released = await request(api, "PATCH", path, body=release_ops(kind, read, now), content_type=JSON_PATCH)
    assert released["spec"]["runPolicy"]["suspend"] is False
    assert released["metadata"]["annotations"]["dispatch.dev/released"] == now

    # 2. A stop after the read: refused, still held.
    path, read = await created(2)
    await stopped_since(read, path)

    # 3. Read without annotations: released; with a stop's annotation added since: refused.
    path, _ = await created(3)
    bare = await request(
        api, "PATCH", path, body=[{"op": "remove", "path": "/metadata/annotations"}], content_type=JSON_PATCH
    )
    assert not bare["metadata"].get("annotations")
    await stopped_since(bare, path)
    await request(
        api, "PATCH", path, body=[{"op": "remove", "path": "/metadata/annotations"}], content_type=JSON_PATCH
    )
    released = await request(api, "PATCH", path, body=release_ops(kind, bare, now), content_type=JSON_PATCH)
    assert released["spec"]["runPolicy"]["suspend"] is False

    # 4. Being deleted (dispatch's object finalizer holds it): refused, still held.
    path, read = await created(4)
    await request(api, "DELETE", path)
    await refused(read, path)

    # The kit's own release of a stopped object (2) writes nothing and returns.
    await backend.release(f"{namespace}/cond-2")
    assert await held(f"{PJ.format(ns=namespace)}/cond-2")
    for n in (1, 2, 3, 4):
        await backend.end(f"{namespace}/cond-{n}")

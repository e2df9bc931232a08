"""The operator SIGKILLed at each step of the submission protocol, and two operators at once.

Invariants checked (docs: semantics.md): at most one released PyTorchJob per DispatchJob at any
moment (watched throughout), only canonical objects released, submissions 1..n each authorized
once, orphans ended, and the job settles with the seed's history.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import time
from collections.abc import Callable
from typing import Any

import pytest

from dispatch._backends.kubeflow._adapter import KubeflowBackend
from dispatch._dispatchjob import record_from
from dispatch._kubeclient import KubeClient
from tests.integration.conftest import (
    WAIT,
    OperatorProcess,
    ReleaseMonitor,
    apply,
    await_for,
    dispatch_job,
    get_job,
    history,
    pytorchjobs,
    released,
)
from tests.support.builders import SEED_HISTORY
from tests.support.kube import KubeCluster
from tests.support.lab import Kubeflow, replica_count

pytestmark = pytest.mark.integration

CRASH_POINTS = [
    "Authorize:1",
    "Create:1",
    "RecordCanonical:1",
    "Release:1",
    "Authorize:2",
    "Create:2",
    "RecordCanonical:2",
    "Release:2",
    "RecordOutcome",
    "RecordSettled",
]


def _ended(pj: dict[str, Any]) -> bool:
    meta = pj["metadata"]
    if meta.get("deletionTimestamp") or (meta.get("annotations") or {}).get("dispatch.dev/ended"):
        return True
    return any(
        c["type"] in ("Succeeded", "Failed") and c["status"] == "True"
        for c in (pj.get("status") or {}).get("conditions") or ()
    )


async def drive_seed(
    cluster: KubeCluster,
    namespace: str,
    jobs: list[str],
    kubeflow: Kubeflow,
    operators: list[OperatorProcess],
    *,
    restart: bool = True,
    preemptions: int = 1,
    deadline: float = 2 * WAIT,
) -> dict[str, dict[str, Any]]:
    """Play the scheduler's part of the seed for each job (kube-scheduler preempts submissions
    1..``preemptions``, the next one succeeds; the preemptions that are due are issued together),
    restarting crashed operators (without the crash hook) unless ``restart`` is off, until every
    job settles."""
    done: set[str] = set()
    until = time.monotonic() + deadline
    bodies: dict[str, dict[str, Any]] = {}
    while time.monotonic() < until:
        if restart:
            for op in operators:
                if not op.running:
                    op.start(env={"DISPATCH_TEST_CRASH_AFTER": ""})
        acts = []
        for pj in await asyncio.to_thread(pytorchjobs, cluster, namespace):
            name = pj["metadata"]["name"]
            if name in done or not released(pj) or _ended(pj):
                continue
            pods = await kubeflow.pods(namespace, name)
            # Every replica, not just the pods listed so far: the training operator may create the
            # workers before the master, and a job acted on half-made never settles.
            if len(pods) < replica_count(pj) or any(
                (p.get("status") or {}).get("phase") != "Running" for p in pods
            ):
                continue
            submission = int((pj["metadata"].get("labels") or {}).get("dispatch.dev/submission") or 0)
            done.add(name)
            preempt = submission <= preemptions
            acts.append(kubeflow.preempt(namespace, name) if preempt else kubeflow.succeed(namespace, name))
        await asyncio.gather(*acts)
        bodies = {job: await asyncio.to_thread(get_job, cluster, namespace, job) for job in jobs}
        if all((b.get("status") or {}).get("settled") for b in bodies.values()):
            return bodies
        await asyncio.sleep(0.3)
    raise AssertionError(
        f"jobs did not settle: {json.dumps({j: b.get('status') for j, b in bodies.items()})}"
    )


def check_invariants(
    body: dict[str, Any], pjs: list[dict[str, Any]], monitor: ReleaseMonitor, job: str
) -> None:
    status = body["status"]
    assert history(body) == SEED_HISTORY
    assert [s["n"] for s in status["submissions"]] == [1, 2]  # each authorized once, no gap
    assert status["plan"]["rules"][0]["firings"] == 1
    canonicals = {s["canonical"].split("/", 1)[1] for s in status["submissions"]}
    mine = [pj for pj in pjs if pj["metadata"]["labels"]["dispatch.dev/job"] == job]
    assert {pj["metadata"]["labels"]["dispatch.dev/submission"] for pj in mine} <= {"1", "2"}
    monitor.assert_held()  # checked at every watch event, not from snapshots
    assert monitor.max_live.get(job, 0) <= 1, "two released PyTorchJobs at once"
    assert monitor.released.get(job, set()) <= canonicals, "a non-canonical object was released"
    assert all(_ended(pj) for pj in mine), "settled with a live object"


@pytest.mark.parametrize("point", CRASH_POINTS)
async def test_sigkill_at_each_step_then_restart(
    crds: KubeCluster,
    namespace: str,
    operator: Callable[..., OperatorProcess],
    kubeflow: Kubeflow,
    release_monitor: ReleaseMonitor,
    point: str,
) -> None:
    op = operator(env={"DISPATCH_TEST_CRASH_AFTER": point})
    await asyncio.to_thread(apply, crds, namespace, dispatch_job("finetune"))
    bodies = await drive_seed(crds, namespace, ["finetune"], kubeflow, [op])
    if op.starts == 1:  # crashed after the last write: the job had settled; a restart finds it so
        await asyncio.to_thread(op.wait_exit)
        op.start(env={"DISPATCH_TEST_CRASH_AFTER": ""})
    assert op.starts == 2, f"the operator was expected to crash once at {point}:\n{op.log()[-3000:]}"
    assert "killing this process" in op.log()
    pjs = await asyncio.to_thread(pytorchjobs, crds, namespace)
    check_invariants(bodies["finetune"], pjs, release_monitor, "finetune")


async def test_orphan_made_while_the_operator_was_down_is_ended_never_released(
    crds: KubeCluster,
    namespace: str,
    operator: Callable[..., OperatorProcess],
    kubeflow: Kubeflow,
    release_monitor: ReleaseMonitor,
) -> None:
    op = operator(env={"DISPATCH_TEST_CRASH_AFTER": "Create:1"})
    await asyncio.to_thread(apply, crds, namespace, dispatch_job("finetune"))
    await asyncio.to_thread(op.wait_exit)
    (created,) = await asyncio.to_thread(pytorchjobs, crds, namespace)
    # a second creator's object for the same submission (what a concurrent supervisor with another
    # naming scheme, or a person, could leave): tagged (job, 1), held
    rogue = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {
            "name": created["metadata"]["name"] + "-rogue",
            "labels": created["metadata"]["labels"],
            "annotations": created["metadata"].get("annotations") or {},
        },
        "spec": created["spec"],
    }
    await asyncio.to_thread(crds.kubectl, "create", "-n", namespace, "-f", "-", input=json.dumps(rogue))
    bodies = await drive_seed(crds, namespace, ["finetune"], kubeflow, [op])
    assert bodies["finetune"]["status"]["submissions"][0]["canonical"].endswith(created["metadata"]["name"])
    pjs = await asyncio.to_thread(pytorchjobs, crds, namespace)
    assert rogue["metadata"]["name"] not in {pj["metadata"]["name"] for pj in pjs}  # ended (deleted)
    assert rogue["metadata"]["name"] not in release_monitor.released.get("finetune", set())
    check_invariants(bodies["finetune"], pjs, release_monitor, "finetune")


async def test_two_operators_authorize_each_submission_once(
    crds: KubeCluster,
    namespace: str,
    operator: Callable[..., OperatorProcess],
    kubeflow: Kubeflow,
    release_monitor: ReleaseMonitor,
) -> None:
    ops = [operator(), operator()]
    jobs = [f"pair-{i}" for i in range(4)]
    for job in jobs:
        await asyncio.to_thread(apply, crds, namespace, dispatch_job(job, nodes=1))
    bodies = await drive_seed(crds, namespace, jobs, kubeflow, ops, restart=False)
    pjs = await asyncio.to_thread(pytorchjobs, crds, namespace)
    assert len(pjs) == 2 * len(jobs)  # one PyTorchJob per submission, two submissions per job
    for job in jobs:
        check_invariants(bodies[job], pjs, release_monitor, job)
    assert all(op.running for op in ops)
    # both processes supervised (each wrote steps); the losers of the CAS re-read and decided again
    steps = [
        sum(
            1
            for line in op.log().splitlines()
            if "authorizing submission" in line or "recording object" in line
        )
        for op in ops
    ]
    assert sum(steps) == 4 * len(jobs), steps


async def test_a_preemption_while_the_operator_is_down_is_recovered_once_it_is_back(
    crds: KubeCluster,
    namespace: str,
    operator: Callable[..., OperatorProcess],
    kubeflow: Kubeflow,
    release_monitor: ReleaseMonitor,
) -> None:
    """kube-scheduler preempts the pod while no operator runs, and the training operator makes it
    again before one starts: the operator started next finds a running pod, and only the
    scheduler's Event says it was preempted. The job recovers under its rule all the same.

    The random SIGKILL test above met this in one run of six on a loaded machine (the job sat in
    its old state with the recreated pod running): the training operator, starved, did not see the
    preempted pod fail before it was gone, and replaced it as a missing replica although the
    policy is Never. Here it is not running meanwhile, which makes that order certain."""
    job = "downtime"
    op = operator()
    rules = [{"on": ["preempted"], "budget": 1}]
    await asyncio.to_thread(apply, crds, namespace, dispatch_job(job, nodes=1, rules=rules))
    async with asyncio.timeout(WAIT):
        [first] = await kubeflow.wait_pods(namespace, f"{job}-1")
    op.kill()
    await asyncio.to_thread(op.wait_exit)
    await kubeflow.stop_training_operator()  # restarted by the fixture's restore if this fails
    await kubeflow.preempt(namespace, f"{job}-1")
    async with asyncio.timeout(WAIT):
        await kubeflow.wait_pod_gone(namespace, first["metadata"]["name"], first["metadata"]["uid"])
    await kubeflow.start_training_operator()
    async with asyncio.timeout(WAIT):
        while True:  # made again by the training operator, and running
            pods = await kubeflow.wait_pods(namespace, f"{job}-1")
            if all(p["metadata"]["uid"] != first["metadata"]["uid"] for p in pods):
                break
            await asyncio.sleep(0.1)
    op.start()
    async with asyncio.timeout(WAIT):
        while True:  # submission 2 released: the fence has stopped submission 1 by then
            pjs = await asyncio.to_thread(pytorchjobs, crds, namespace)
            if any(pj["metadata"]["name"] == f"{job}-2" and released(pj) for pj in pjs):
                break
            await asyncio.sleep(0.2)
    bodies = await drive_seed(crds, namespace, [job], kubeflow, [op], restart=False, preemptions=1)
    status = bodies[job]["status"]
    assert [h[3] for h in history(bodies[job])] == ["preempted", "none"], status.get("history")
    assert "from its event" in status["submissions"][0]["cause"]["detail"], status["submissions"]
    assert status["state"] == "succeeded", status
    assert [s["n"] for s in status["submissions"]] == [1, 2]
    release_monitor.assert_held()
    pjs = await asyncio.to_thread(pytorchjobs, crds, namespace)
    assert all(_ended(pj) for pj in pjs), "settled with a live object"


@pytest.mark.parametrize("down", [False, True], ids=["operator-running", "operator-down"])
async def test_an_object_created_after_the_job_settled_is_ended(
    crds: KubeCluster,
    namespace: str,
    operator: Callable[..., OperatorProcess],
    kubeflow: Kubeflow,
    api: KubeClient,
    release_monitor: ReleaseMonitor,
    down: bool,
) -> None:
    """Invariant 5's exception: a supervisor decided a Create before the job settled, its create
    landed after the settle, and it died before it could read the record again and end what it
    made. The object is held; the operator ends it, never releases it, and writes nothing to the
    settled record: at once while it runs (the kit's watch shows the object of a job no turn is
    subscribed to), or at its next start (a settled job's first turn lists its objects)."""
    job = "late"
    op = operator()
    await asyncio.to_thread(apply, crds, namespace, dispatch_job(job, nodes=1))
    bodies = await drive_seed(crds, namespace, [job], kubeflow, [op], restart=False, preemptions=0)
    settled_status = bodies[job]["status"]
    assert settled_status["state"] == "succeeded", settled_status
    if down:
        op.stop()
    record = record_from(bodies[job])
    creator = KubeflowBackend(api, namespaces=[namespace])  # the supervisor that died after this create
    try:
        late = await creator.create(record.job, 2, record.spec, record.plan)
    finally:
        await creator.aclose()
    name = late.split("/", 1)[1]
    if down:
        op.start()

    def late_gone() -> bool:
        return name not in {pj["metadata"]["name"] for pj in pytorchjobs(crds, namespace)}

    await await_for(f"the late object {late} ended", late_gone)
    await await_for("the operator's line for that end", lambda: f"ending object {late}" in op.log())
    assert name not in release_monitor.released.get(job, set()), "the late object was released"
    release_monitor.assert_held()
    after = await asyncio.to_thread(get_job, crds, namespace, job)
    assert after["status"] == settled_status, "the settled record was written"


async def _past_imports(op: OperatorProcess) -> None:
    """Until the process has written a line after its start marker (or died, or a minute passed)."""
    marker = f"===== start {op.starts}:"
    deadline = time.monotonic() + 60.0
    while time.monotonic() < deadline and op.running:
        text = op.log()
        at = text.rfind(marker)
        if at >= 0 and text[at:].count("\n") >= 2:
            return
        await asyncio.sleep(0.1)


async def test_sigkill_at_random_moments_during_mass_preemptions(
    crds: KubeCluster,
    namespace: str,
    operator: Callable[..., OperatorProcess],
    kubeflow: Kubeflow,
    release_monitor: ReleaseMonitor,
) -> None:
    """Several jobs, each preempted twice by kube-scheduler (preemptions issued together), while
    the operator is SIGKILLed and restarted at random moments. Never two released PyTorchJobs of
    a job at any watch event; every covered preemption recorded as preempted, never unknown."""
    seed = int(os.environ.get("DISPATCH_TEST_SEED") or random.SystemRandom().randrange(1 << 30))
    rng = random.Random(seed)
    print(f"DISPATCH_TEST_SEED={seed}")
    jobs = [f"mass-{i}" for i in range(5)]
    op = operator()
    for job in jobs:
        manifest = dispatch_job(job, nodes=1, rules=[{"on": ["preempted"], "budget": 2}])
        await asyncio.to_thread(apply, crds, namespace, manifest)
    stop = asyncio.Event()
    kills = 0

    async def killer() -> None:
        nonlocal kills
        while not stop.is_set():
            # Kill only a process past its imports: on a loaded machine starting Python takes longer
            # than the kill interval, and kills that land before any work test nothing.
            await _past_imports(op)
            await asyncio.sleep(rng.uniform(0.2, 2.0))
            if op.running:
                op.kill()
                kills += 1
            await asyncio.sleep(rng.uniform(0.0, 1.0))
            op.start()

    killing = asyncio.create_task(killer())
    try:
        bodies = await drive_seed(
            crds, namespace, jobs, kubeflow, [op], restart=False, preemptions=2, deadline=3 * WAIT
        )
    except AssertionError as e:
        raise AssertionError(f"seed {seed}: {e}") from None
    finally:
        stop.set()
        killing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await killing
    if not op.running:
        op.start()
    print(f"seed {seed}: {kills} SIGKILLs")
    release_monitor.assert_held()
    pjs = await asyncio.to_thread(pytorchjobs, crds, namespace)
    for job in jobs:
        status = bodies[job]["status"]
        causes = [h[3] for h in history(bodies[job])]
        assert causes == ["preempted", "preempted", "none"], (seed, job, status.get("history"))
        assert status["state"] == "succeeded", (seed, job, status)
        assert [s["n"] for s in status["submissions"]] == [1, 2, 3], (seed, job)
        assert status["plan"]["rules"][0]["firings"] == 2, (seed, job)
        canonicals = {s["canonical"].split("/", 1)[1] for s in status["submissions"]}
        assert release_monitor.released.get(job, set()) <= canonicals, (seed, job)
        mine = [pj for pj in pjs if pj["metadata"]["labels"]["dispatch.dev/job"] == job]
        assert all(_ended(pj) for pj in mine), (seed, job, "settled with a live object")

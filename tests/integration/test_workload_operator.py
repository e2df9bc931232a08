"""The kit's kinds through the operator, driven as a user drives them: ``kubectl apply`` of a
DispatchJob with ``spec.backend: job``, ``jobset`` or ``trainjob`` on the lab (kube-controller-manager's
real Job controller, kube-scheduler, kwok as the kubelet; for JobSet and TrainJob the lab's extras:
JobSet v0.11.1 with its webhooks, Kubeflow Trainer v2.2.0 and its torch-distributed runtime).

Each behaviour runs for each kind: the lifecycle with a preemption by kube-scheduler recovered,
exit codes and OOM, cancel and delete, and the operator SIGKILLed mid-protocol with never two
released objects of one DispatchJob (a watch checks every state the API server held); a native
rule is enforced by the kind's own controller where the kind has one (the Job controller's
podFailurePolicy, JobSet's failurePolicy).
Run: ``.venv/bin/pytest -m integration tests/integration/test_workload_operator.py``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from tests.integration.conftest import (
    WAIT,
    OperatorProcess,
    ReleaseMonitor,
    apply,
    await_for,
    follow_releases,
    get_job,
    history,
    settled,
)
from tests.support.builders import PREEMPTED_ONCE, SEED_HISTORY, lab_manifest
from tests.support.kube import KubeCluster
from tests.support.lab import Kubeflow

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class Kind:
    """A kind as these tests see it: its backend, its API resource, the container of its pods
    that exits, the conditions that end it, and whether it needs the lab's extras."""

    backend: str
    resource: tuple[str, str, str]
    container: str
    finished: tuple[str, ...]
    extras: bool

    @property
    def plural(self) -> str:
        return f"{self.resource[2]}.{self.resource[0]}"


JOB_ENDED = ("Complete", "Failed", "FailureTarget", "SuccessCriteriaMet")
JOB = Kind("job", ("batch", "v1", "jobs"), "main", JOB_ENDED, extras=False)
JOBSET = Kind(
    "jobset", ("jobset.x-k8s.io", "v1alpha2", "jobsets"), "main", ("Completed", "Failed"), extras=True
)
TRAINJOB = Kind(
    "trainjob", ("trainer.kubeflow.org", "v1alpha1", "trainjobs"), "node", ("Complete", "Failed"), extras=True
)
KINDS = [pytest.param(kind, id=kind.backend) for kind in (JOB, JOBSET, TRAINJOB)]
EVERY_STEP = ("Create:1", "Release:1", "Authorize:2", "Create:2", "Release:2")
CRASH_POINTS = [
    *(pytest.param(JOB, p, id=f"job-{p}") for p in EVERY_STEP),
    *(
        pytest.param(k, p, id=f"{k.backend}-{p}")
        for k in (JOBSET, TRAINJOB)
        for p in ("Release:1", "Create:2")
    ),
]
"""Every step of the protocol for the Job (the template kind), the two that matter most (the first
release and the replacement's create) for the kinds of the extras."""


def manifest(kind: Kind, name: str, rules: list[dict[str, Any]], **spec: Any) -> str:
    return lab_manifest(kind.backend, name, rules, **spec)


@pytest.fixture
def kind_on_the_lab(kind: Kind, request: pytest.FixtureRequest) -> Kind:
    """The test's kind (its parameter), with the lab's extras started first when the kind needs
    them (a sync fixture: the extras start outside the test's event loop)."""
    if kind.extras:
        request.getfixturevalue("lab_extras")
    return kind


@pytest.fixture
async def monitor(crds: KubeCluster, namespace: str, kind_on_the_lab: Kind) -> AsyncIterator[ReleaseMonitor]:
    """Every state of every object of the test's kind in the namespace: never two released at once
    per DispatchJob."""
    kind = kind_on_the_lab
    watcher = ReleaseMonitor(
        suspended=lambda o: bool((o.get("spec") or {}).get("suspend")), finished=kind.finished
    )
    async with follow_releases(crds, namespace, kind.resource, watcher) as followed:
        yield followed


def objects(cluster: KubeCluster, kind: Kind, namespace: str) -> list[dict[str, Any]]:
    out = json.loads(cluster.kubectl("get", kind.plural, "-n", namespace, "-o", "json"))
    items: list[dict[str, Any]] = out["items"]
    return sorted(items, key=lambda o: o["metadata"]["name"])


def is_released(obj: Mapping[str, Any]) -> bool:
    return not (obj.get("spec") or {}).get("suspend")


async def released(cluster: KubeCluster, kind: Kind, namespace: str, name: str, n: int) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        for obj in objects(cluster, kind, namespace):
            labels = obj["metadata"].get("labels") or {}
            if labels.get("dispatch.dev/job") == name and labels.get("dispatch.dev/submission") == str(n):
                return obj if is_released(obj) else None
        return None

    found: dict[str, Any] = await await_for(f"{name} submission {n} released", probe)
    return found


async def one_pod(
    kubeflow: Kubeflow, namespace: str, name: str, n: int, besides: tuple[str, ...] = ()
) -> str:
    (pod,) = await asyncio.wait_for(kubeflow.wait_workload_pods(namespace, name, n, besides=besides), 60)
    return pod


@dataclass
class Run:
    """One test's lab, operator and watch for its kind: what every test below starts from."""

    crds: KubeCluster
    namespace: str
    operator: Callable[..., OperatorProcess]
    kubeflow: Kubeflow
    monitor: ReleaseMonitor
    kind: Kind

    async def submit(self, name: str, rules: list[dict[str, Any]], **spec: Any) -> None:
        """``kubectl apply`` of a DispatchJob of the kind named ``name``."""
        await asyncio.to_thread(apply, self.crds, self.namespace, manifest(self.kind, name, rules, **spec))

    async def start(self, name: str, rules: list[dict[str, Any]], **env: str) -> OperatorProcess:
        """An operator for the kind (with ``env``), then the DispatchJob ``name`` applied."""
        op = self.operator("--backend", self.kind.backend, env=env)
        await self.submit(name, rules)
        return op

    async def released(self, name: str, n: int) -> dict[str, Any]:
        return await released(self.crds, self.kind, self.namespace, name, n)

    async def one_pod(self, name: str, n: int, besides: tuple[str, ...] = ()) -> str:
        return await one_pod(self.kubeflow, self.namespace, name, n, besides)

    async def exit_pod(self, pod: str, code: int, reason: str | None = None) -> None:
        await self.kubeflow.exit_pod(self.namespace, pod, code, reason=reason, container=self.kind.container)

    async def settled(self, name: str) -> dict[str, Any]:
        return await settled(self.crds, self.namespace, name)

    async def objects(self) -> list[dict[str, Any]]:
        return await asyncio.to_thread(objects, self.crds, self.kind, self.namespace)


@pytest.fixture
def run(
    crds: KubeCluster,
    namespace: str,
    operator: Callable[..., OperatorProcess],
    kubeflow: Kubeflow,
    monitor: ReleaseMonitor,
    kind_on_the_lab: Kind,
) -> Run:
    return Run(crds, namespace, operator, kubeflow, monitor, kind_on_the_lab)


@pytest.mark.parametrize("kind", KINDS)
async def test_preemption_is_recovered_and_the_object_is_built_as_documented(run: Run) -> None:
    await run.start("finetune", PREEMPTED_ONCE)
    first = await run.released("finetune", 1)
    assert first["metadata"]["ownerReferences"][0]["kind"] == "DispatchJob"
    assert "dispatch.dev/record-before-delete" in first["metadata"]["finalizers"]
    if run.kind is JOB:
        assert first["spec"]["podReplacementPolicy"] == "Failed"
        assert first["spec"]["backoffLimit"] == 0
        assert first["spec"]["template"]["spec"]["containers"][0]["name"] == "main"
    await run.kubeflow.preempt_pod(run.namespace, await run.one_pod("finetune", 1))
    await run.released("finetune", 2)
    await run.exit_pod(await run.one_pod("finetune", 2), 0)
    body = await run.settled("finetune")
    status = body["status"]
    assert history(body) == SEED_HISTORY
    assert status["submissions"][0]["cause"]["kind"] == "preempted"
    assert status["plan"]["rules"][0]["enforcer"] == "supervisor"
    run.monitor.assert_held()
    assert run.monitor.max_live.get("finetune", 0) == 1
    assert run.monitor.released["finetune"] == {"finetune-1", "finetune-2"}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("code", "reason", "cause"), [(3, None, "non-zero-exit"), (137, "OOMKilled", "out-of-memory")]
)
async def test_exit_codes_and_oom_fail_the_job_with_their_cause(
    run: Run, code: int, reason: str | None, cause: str
) -> None:
    """For a TrainJob the exit is a restart in place by the kubelet (the runtime's pods are
    OnFailure): no rule asked for it, so dispatch stops the TrainJob and the job fails with it."""
    await run.start("fails", PREEMPTED_ONCE)
    await run.exit_pod(await run.one_pod("fails", 1), code, reason)
    body = await run.settled("fails")
    status = body["status"]
    assert status["state"] == "failed"
    assert status["cause"]["kind"] == cause
    assert status["cause"]["exitCode"] == code
    run.monitor.assert_held()


@pytest.mark.parametrize("kind", [pytest.param(JOB, id="job"), pytest.param(JOBSET, id="jobset")])
async def test_a_native_rule_is_enforced_by_the_kinds_own_controller(run: Run) -> None:
    """restart on exactly [non-zero-exit out-of-memory]: planned for the scheduler, and built so
    that the kind's controller restarts after an exit (one object, one submission).

    A Job: backoffLimit + podFailurePolicy; the Job controller replaces the failed pod, the restart
    is on the record, and the replacement succeeds. A JobSet: its failurePolicy (maxRestarts 1);
    JobSet restarts itself (every pod recreated) and the second exit fails it with
    ReachedMaxRestarts."""
    is_job = run.kind is JOB
    await run.start("native", [{"on": ["non-zero-exit", "out-of-memory"], "action": "restart", "budget": 1}])
    obj = await run.released("native", 1)
    if is_job:
        assert obj["spec"]["backoffLimit"] == 1
        assert [r["action"] for r in obj["spec"]["podFailurePolicy"]["rules"]] == ["FailJob", "Count"]
    else:
        assert obj["spec"]["failurePolicy"]["maxRestarts"] == 1
    first = await run.one_pod("native", 1)
    await run.exit_pod(first, 1)
    second = await run.one_pod("native", 1, besides=(first,))
    if is_job:
        await await_for(
            "the restart recorded",
            lambda: (
                (get_job(run.crds, run.namespace, "native")["status"].get("submissions") or [{}])[0].get(
                    "restarts"
                )
                == 1
            ),
        )
    await run.exit_pod(second, 0 if is_job else 1)
    status = (await run.settled("native"))["status"]
    assert status["plan"]["rules"][0]["enforcer"] == "scheduler"
    assert [s["n"] for s in status["submissions"]] == [1]
    (only,) = await run.objects()
    if is_job:
        assert status["state"] == "succeeded"
        assert only["metadata"]["name"] == "native-1"
    else:
        assert status["state"] == "failed"
        assert status["cause"]["kind"] == "non-zero-exit"
        failed = {c["type"]: c for c in only["status"]["conditions"]}["Failed"]
        assert (failed["reason"], only["status"]["restarts"]) == ("ReachedMaxRestarts", 1)
    run.monitor.assert_held()


@pytest.mark.parametrize("kind", KINDS)
async def test_cancel_then_delete_leaves_nothing(run: Run) -> None:
    await run.start("stopme", PREEMPTED_ONCE)
    await run.one_pod("stopme", 1)
    await run.submit("stopme", PREEMPTED_ONCE, cancel=True)
    body = await run.settled("stopme")
    assert body["status"]["state"] == "cancelled"
    assert await run.objects() == []
    crds, namespace = run.crds, run.namespace
    await asyncio.to_thread(crds.kubectl, "delete", "dispatchjob", "stopme", "-n", namespace, "--timeout=60s")
    await await_for(
        "no pods left",
        lambda: (
            not json.loads(
                crds.kubectl("get", "pods", "-n", namespace, "-l", "dispatch.dev/job=stopme", "-o", "json")
            )["items"]
        ),
    )


@pytest.mark.parametrize(("kind", "point"), CRASH_POINTS)
async def test_sigkill_mid_protocol_never_two_released_objects(run: Run, point: str) -> None:
    """The operator SIGKILLed right after a step of the protocol (its test hook), restarted without
    the hook: the seed's history, each submission authorized once, and at no moment two released
    objects of the DispatchJob."""
    op = await run.start("crash", PREEMPTED_ONCE, DISPATCH_TEST_CRASH_AFTER=point)
    acted: set[str] = set()
    deadline = time.monotonic() + 2 * WAIT
    body: dict[str, Any] = {}
    while time.monotonic() < deadline:
        if not op.running:
            op.start(env={"DISPATCH_TEST_CRASH_AFTER": ""})
        for obj in await run.objects():
            name = obj["metadata"]["name"]
            if (
                name in acted
                or not is_released(obj)
                or obj["metadata"].get("annotations", {}).get("dispatch.dev/ended")
            ):
                continue
            n = int(obj["metadata"]["labels"]["dispatch.dev/submission"])
            running = await run.kubeflow.wait_workload_pods(run.namespace, "crash", n)
            acted.add(name)
            if n == 1:
                await run.kubeflow.preempt_pod(run.namespace, running[0])
            else:
                await run.exit_pod(running[0], 0)
        body = await asyncio.to_thread(get_job, run.crds, run.namespace, "crash")
        if (body.get("status") or {}).get("settled"):
            break
        await asyncio.sleep(0.3)
    assert (body.get("status") or {}).get("settled"), body.get("status")
    assert op.starts == 2, f"expected one crash at {point}:\n{op.log()[-3000:]}"
    assert history(body) == SEED_HISTORY
    assert [s["n"] for s in body["status"]["submissions"]] == [1, 2]
    run.monitor.assert_held()
    assert run.monitor.max_live.get("crash", 0) <= 1
    canonicals = {s["canonical"].split("/", 1)[1] for s in body["status"]["submissions"]}
    assert run.monitor.released.get("crash", set()) <= canonicals


@pytest.mark.parametrize("kind", KINDS)
async def test_a_time_limit_is_hit_recovered_by_its_rule_and_then_fails_the_job(run: Run) -> None:
    """``timeLimitSeconds``: the Job controller's activeDeadlineSeconds on a Job, the supervisor's
    stop (counted from the pods' start) on the others. Each submission hits it: the rule answers
    the first, and the second, with the budget spent, fails the job with the same cause."""
    run.operator("--backend", run.kind.backend)
    await run.submit("limited", [{"on": ["time-limit"], "budget": 1}], timeLimitSeconds=4)
    first = await run.released("limited", 1)
    if run.kind is JOB:
        assert first["spec"]["activeDeadlineSeconds"] == 4
    else:
        assert "activeDeadlineSeconds" not in first["spec"]
    body = await run.settled("limited")
    status = body["status"]
    assert history(body) == [
        ("pending", "recovering", 2, "time-limit"),
        ("recovering", "failed", 2, "time-limit"),
    ]
    assert status["plan"]["timeLimit"]["enforcer"] == ("scheduler" if run.kind is JOB else "supervisor")
    if run.kind is not JOB:
        # Recorded before the stop, by the supervisor: the end is read as the time limit.
        assert status["submissions"][0]["stop"]["actor"]["kind"] == "supervisor"
    run.monitor.assert_held()
    assert run.monitor.max_live.get("limited", 0) == 1


@pytest.mark.parametrize("kind", KINDS)
async def test_the_deadline_ends_the_job_and_nothing_is_resubmitted(run: Run) -> None:
    run.operator("--backend", run.kind.backend)
    # (a TrainJob cannot carry a grace: its plan refuses one but the default)
    stop = {} if run.kind is TRAINJOB else {"stop": {"gracePeriodSeconds": 7}}
    await run.submit("late", PREEMPTED_ONCE, deadlineSeconds=4, **stop)
    obj = await run.released("late", 1)
    if run.kind is JOB:
        assert obj["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 7
    body = await run.settled("late")
    status = body["status"]
    assert history(body) == [("pending", "failed", 1, "deadline-exceeded")]
    assert "deadline-exceeded" in status["plan"]["uncovered"]
    assert status["submissions"][0]["stop"]["cause"]["kind"] == "deadline-exceeded"
    assert [s["n"] for s in status["submissions"]] == [1]
    # The lab's kubelet ends a deleted pod's containers as SIGTERM does (exit 143), within the grace.
    assert status["cause"]["stop"] == "graceful", status
    run.monitor.assert_held()


@pytest.mark.parametrize("kind", [pytest.param(JOB, id="job")])
async def test_a_stop_the_program_does_not_heed_is_recorded_forced(run: Run) -> None:
    """The lab's kubelet kills the containers with exit code 137 (SIGKILL at the grace's end)."""
    run.operator("--backend", run.kind.backend)
    deaf = {"podAnnotations": {"lab.dispatch.io/termination-exit-code": "137"}}
    manifest = lab_manifest(run.kind.backend, "deaf", [], options=deaf, deadlineSeconds=4)
    await asyncio.to_thread(apply, run.crds, run.namespace, manifest)
    status = (await run.settled("deaf"))["status"]
    assert (status["cause"]["kind"], status["cause"]["stop"]) == ("deadline-exceeded", "forced"), status

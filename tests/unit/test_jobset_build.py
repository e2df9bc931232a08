"""The JobSet and TrainJob builders, table-style, and checked against what the real stack kept.

The recordings (tests/unit/data/{jobset,trainjob}/, hack/record.py jobset/trainjob) hold the objects as the
API server returned them after JobSet's and Trainer's webhooks: every field the builder writes must
come back unchanged (the webhooks only add defaults).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatch import _dispatchjob
from dispatch._backends.jobset import BACKEND as JOBSET_BACKEND
from dispatch._backends.jobset import JobSetOptions
from dispatch._backends.jobset._adapter import JOBSET
from dispatch._backends.jobset._adapter import build as build_jobset
from dispatch._backends.jobset._kind import EXIT_RULE_MESSAGE, pod_failure_policy
from dispatch._backends.trainjob import BACKEND as TRAINJOB_BACKEND
from dispatch._backends.trainjob import TrainJobOptions
from dispatch._backends.trainjob._adapter import TRAINJOB
from dispatch._backends.trainjob._adapter import build as build_trainjob
from dispatch._errors import BackendError
from dispatch._model import Action, CauseKind, Enforcer, JobSpec, Plan, PlannedRule, Resources
from dispatch._plan import make_plan
from dispatch._workload import Refused, Target
from tests.support.builders import (
    RESUBMIT,
    TARGET,
    build_options,
    identity,
    job_spec,
    restart_rule,
    without_identity,
)
from tests.support.recorded import load

DATA = Path(__file__).parent / "data"
LABELS = {
    "dispatch.dev/job": "train",
    "dispatch.dev/submission": "3",
    "app.kubernetes.io/managed-by": "dispatch",
}
Body = dict[str, Any]


def jobset_spec(nodes: int = 2, env: dict[str, str] | None = None) -> JobSpec:
    return job_spec("jobset", build_options(JobSetOptions, env), nodes=nodes)


def jobset(rules: tuple[PlannedRule, ...] = (), **kw: Any) -> Body:
    return build_jobset(TARGET, jobset_spec(**kw), Plan(job="ns/train", rules=rules))


@pytest.mark.parametrize(
    ("rules", "max_restarts", "rule_names"),
    [
        ((), 0, ["other"]),
        ((RESUBMIT,), 0, ["other"]),
        ((restart_rule(3, 0),), 3, ["exited", "other"]),
        ((restart_rule(3, 2),), 1, ["exited", "other"]),
        ((restart_rule(3, 3),), 0, ["other"]),
    ],
)
def test_failure_policy_carries_what_is_left_of_the_native_rule(
    rules: tuple[PlannedRule, ...], max_restarts: int, rule_names: list[str]
) -> None:
    body = jobset(rules)
    policy = body["spec"]["failurePolicy"]
    assert policy["maxRestarts"] == max_restarts
    assert [r["name"] for r in policy["rules"]] == rule_names
    assert policy["rules"][-1] == {"name": "other", "action": "FailJobSet"}  # no match would restart it
    assert JOBSET.in_place(body) is (max_restarts > 0)


def test_the_restart_rule_matches_exactly_the_exit_code_rule_of_the_pod_failure_policy() -> None:
    """The JobSet rule's message pattern names the index of the Job's exit-code rule, in the words of
    the Job controller (pod_failure_policy.go)."""
    exited = jobset((restart_rule(2, 0),))["spec"]["failurePolicy"]["rules"][0]
    assert exited["action"] == "RestartJobSet"
    assert exited["onJobFailureReasons"] == ["PodFailurePolicy"]
    index = int(re.search(r"index (\d+)", EXIT_RULE_MESSAGE).group(1))  # type: ignore[union-attr]
    assert "onExitCodes" in pod_failure_policy()["rules"][index]
    assert exited["onJobFailureMessagePatterns"] == [EXIT_RULE_MESSAGE]
    recorded = load(DATA / "jobset", "restarts-exhausted")
    messages = [e["message"] for e in recorded["events"] if e["reason"] == "PodFailurePolicy"]
    assert messages
    assert all(EXIT_RULE_MESSAGE in m for m in messages)


def test_jobset_is_held_labelled_and_one_indexed_job() -> None:
    body = jobset(nodes=4, env={"A": "1"})
    assert body["metadata"]["name"] == "train-3"
    assert body["metadata"]["labels"] == LABELS
    assert body["metadata"]["ownerReferences"][0]["kind"] == "DispatchJob"
    assert JOBSET.suspended(body)
    (rjob,) = body["spec"]["replicatedJobs"]
    assert rjob["replicas"] == 1
    job = rjob["template"]["spec"]
    assert (job["parallelism"], job["completions"], job["completionMode"]) == (4, 4, "Indexed")
    assert (job["backoffLimit"], job["podReplacementPolicy"]) == (0, "Failed")
    pod = job["template"]
    assert pod["metadata"]["labels"] == LABELS
    assert pod["spec"]["restartPolicy"] == "Never"
    (main,) = pod["spec"]["containers"]
    assert main["name"] == JOBSET.container
    assert main["command"] == ["python", "t.py"]
    assert main["env"] == [{"name": "A", "value": "1"}, *identity("ns", "train", 3)]
    assert main["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert JOBSET.suspend_patch(False) == {"spec": {"suspend": False}}


def test_jobset_needs_its_options_and_refuses_what_can_never_run() -> None:
    with pytest.raises(BackendError, match=r"spec\.jobset"):
        build_jobset(TARGET, JobSpec(name="train", command=("x",)), Plan(job="ns/train"))
    bad = JobSetOptions.model_construct(image="img:1", resources=Resources(), env={"A=B": "1"})
    unchecked = JobSpec.model_construct(name="train", command=("x",), nodes=1, options={"jobset": bad})
    with pytest.raises(Refused, match=r"spec\.jobset\.env") as refused:
        build_jobset(TARGET, unchecked, Plan(job="ns/train"))
    assert refused.value.field.startswith("spec.jobset.env")
    with pytest.raises(Refused, match="limit"):
        jobset(env={f"V{i}": "x" * 30000 for i in range(60)})


def _subset(built: Any, kept: Any, path: str = "") -> None:
    """Every field ``built`` has, ``kept`` has with the same value (``kept`` may have more)."""
    if isinstance(built, dict):
        assert isinstance(kept, dict), path
        for key, value in built.items():
            assert key in kept, f"{path}.{key} dropped by the API server"
            _subset(value, kept[key], f"{path}.{key}")
    elif isinstance(built, list) and built and isinstance(built[0], dict) and "name" in built[0]:
        by_name = {item.get("name"): item for item in kept}
        for item in built:
            _subset(item, by_name.get(item["name"]), f"{path}[{item['name']}]")
    else:
        assert built == kept, f"{path}: {built!r} != {kept!r}"


@pytest.mark.parametrize(
    ("backend", "resource"),
    [("jobset", "jobsets.jobset.x-k8s.io"), ("trainjob", "trainjobs.trainer.kubeflow.org")],
)
def test_the_real_stack_kept_every_field_the_builder_wrote(backend: str, resource: str) -> None:
    recorded = load(DATA / backend, "success")
    first = next(e["object"] for e in recorded["stream"] if e["resource"] == resource)
    ns, job = first["metadata"]["namespace"], first["metadata"]["labels"]["dispatch.dev/job"]
    target = Target(ns, job, 1)
    res = Resources(cpu="1", memory="1Gi")
    if backend == "jobset":
        options: Any = JobSetOptions(
            image="example.invalid/train:1", resources=res, env={"A": "1"}, no_capacity_after_seconds=5
        )
        build = build_jobset
    else:
        options = TrainJobOptions(
            runtime="torch-distributed",
            image="example.invalid/train:1",
            resources=res,
            env={"A": "1"},
            no_capacity_after_seconds=5,
        )
        build = build_trainjob
    spec = JobSpec(name=job, command=("python", "train.py"), nodes=2, options={backend: options})
    body = build(target, spec, Plan(job=f"{ns}/{job}", rules=(RESUBMIT,)))
    body["metadata"].pop("finalizers")  # the recorder creates without it (no operator to remove it)
    body["spec"].pop("runtimePatches", None)  # the Trainer's webhook stamps each with its time
    _subset(without_identity(body), first)


def trainjob(options: TrainJobOptions | None = None, nodes: int = 2) -> Body:
    opts = {"trainjob": options} if options is not None else {}
    spec = JobSpec(name="train", command=("python", "t.py"), nodes=nodes, options=opts)
    return build_trainjob(TARGET, spec, Plan(job="ns/train"))


def test_trainjob_names_the_runtime_and_labels_the_trainer_pods() -> None:
    body = trainjob(
        TrainJobOptions(
            runtime="torch-distributed", image="img:1", resources=Resources(cpu="2", gpu=1), env={"A": "1"}
        ),
        nodes=3,
    )
    assert body["metadata"]["labels"] == LABELS
    assert TRAINJOB.suspended(body)
    spec = body["spec"]
    assert spec["runtimeRef"] == {
        "apiGroup": "trainer.kubeflow.org",
        "kind": "ClusterTrainingRuntime",
        "name": "torch-distributed",
    }
    assert spec["trainer"] == {
        "numNodes": 3,
        "command": ["python", "t.py"],
        "image": "img:1",
        "env": [{"name": "A", "value": "1"}, *identity("ns", "train", 3)],
        "resourcesPerNode": {"requests": {"cpu": "2"}, "limits": {"cpu": "2", "nvidia.com/gpu": "1"}},
    }
    (patch,) = spec["runtimePatches"]
    assert patch["manager"] == "dispatch.dev/dispatch"
    (rjob,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert rjob["name"] == "node"
    assert rjob["template"]["spec"]["template"]["metadata"]["labels"] == LABELS


def test_trainjob_defaults_to_the_runtimes_image_and_needs_its_runtime() -> None:
    body = trainjob(TrainJobOptions(runtime="torch-distributed"))
    assert "image" not in body["spec"]["trainer"]
    assert not TRAINJOB.in_place(body)
    custom = trainjob(
        TrainJobOptions(runtime="my-rt.v2", runtime_kind="TrainingRuntime", trainer_job="trainer")
    )
    assert custom["spec"]["runtimeRef"]["kind"] == "TrainingRuntime"
    patch = custom["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
    assert patch["replicatedJobs"][0]["name"] == "trainer"
    with pytest.raises(BackendError, match=r"spec\.trainjob"):
        trainjob()


def test_declarations() -> None:
    """Only JobSet declares a native rule, and only the one its failure policy enforces."""
    (native,) = JOBSET_BACKEND.capabilities.native
    assert native.causes == {CauseKind.NON_ZERO_EXIT, CauseKind.OUT_OF_MEMORY}
    assert native.action is Action.RESTART
    assert TRAINJOB_BACKEND.capabilities.native == ()
    assert JOBSET.capabilities is JOBSET_BACKEND.capabilities
    assert TRAINJOB.capabilities is TRAINJOB_BACKEND.capabilities


def _example(backend: str) -> dict[str, Any]:
    body: dict[str, Any] = yaml.safe_load(
        (Path(__file__).parents[2] / "examples" / f"{backend}-dispatchjob.yaml").read_text()
    )
    return body


def test_the_jobset_example_is_planned_with_jobsets_native_rule() -> None:
    """examples/jobset-dispatchjob.yaml: its restart rule goes to JobSet (maxRestarts 2 over the
    exit-code rule), its resubmit rule to the supervisor."""
    spec = _dispatchjob.job_spec(_example("jobset"))
    plan = make_plan("team-a/pretrain-2n", spec, JOBSET.capabilities, supervised=True)
    assert [r.enforcer for r in plan.rules] == [Enforcer.SCHEDULER, Enforcer.SUPERVISOR]
    body = build_jobset(Target("team-a", "pretrain-2n", 1), spec, plan)
    assert body["spec"]["failurePolicy"]["maxRestarts"] == 2
    assert body["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"] == 2


def test_the_trainjob_example_is_planned_for_the_supervisor() -> None:
    spec = _dispatchjob.job_spec(_example("trainjob"))
    plan = make_plan("team-a/llama-sft", spec, TRAINJOB.capabilities, supervised=True)
    assert [r.enforcer for r in plan.rules] == [Enforcer.SUPERVISOR]
    trainer = build_trainjob(Target("team-a", "llama-sft", 1), spec, plan)["spec"]["trainer"]
    assert (trainer["numNodes"], trainer["command"][0]) == (2, "torchrun")

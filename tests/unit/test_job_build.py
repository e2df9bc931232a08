"""The batch/v1 Job builder, table-style, and checked against what the real API server kept of it.

The recordings (tests/unit/data/job/, hack/record.py job) hold the Jobs as the API server returned
them: every field the builder writes must come back unchanged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatch import _dispatchjob
from dispatch._backends.job import BACKEND, JobOptions
from dispatch._backends.job._adapter import JOB, build
from dispatch._errors import BackendError
from dispatch._model import Enforcer, JobSpec, Plan, PlannedRule, Resources
from dispatch._plan import make_plan
from dispatch._workload import Refused, Target
from tests.support.builders import RESUBMIT, TARGET, build_options, job_spec, restart_rule, without_identity
from tests.support.recorded import load

DATA = Path(__file__).parent / "data" / "job"


def spec(
    nodes: int = 1, env: dict[str, str] | None = None, command: tuple[str, ...] = ("python", "t.py")
) -> JobSpec:
    return job_spec("job", build_options(JobOptions, env), command=command, nodes=nodes)


def built(rules: tuple[PlannedRule, ...] = (), **kw: Any) -> dict[str, Any]:
    return build(TARGET, spec(**kw), Plan(job="ns/train", rules=rules))


@pytest.mark.parametrize(
    ("rules", "backoff", "policy", "budget_annotation"),
    [
        ((), 0, False, None),
        ((RESUBMIT,), 0, False, None),
        ((restart_rule(3, 0),), 3, True, "3"),
        ((restart_rule(3, 2),), 1, True, "1"),
        ((restart_rule(3, 3),), 0, False, "0"),  # nothing left: the first failure ends it
    ],
)
def test_the_native_rule_becomes_backoff_limit_and_pod_failure_policy(
    rules: tuple[PlannedRule, ...], backoff: int, policy: bool, budget_annotation: str | None
) -> None:
    body = built(rules)
    job = body["spec"]
    assert job["suspend"] is True
    assert job["podReplacementPolicy"] == "Failed"
    assert job["template"]["spec"]["restartPolicy"] == "Never"
    assert job["backoffLimit"] == backoff
    assert ("podFailurePolicy" in job) is policy
    if policy:
        first, second = job["podFailurePolicy"]["rules"]
        assert first == {
            "action": "FailJob",
            "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
        }
        assert second["action"] == "Count"
        assert second["onExitCodes"] == {"containerName": "main", "operator": "NotIn", "values": [0]}
    assert body["metadata"]["annotations"].get("dispatch.dev/restart-budget") == budget_annotation
    assert JOB.in_place(body) is policy


@pytest.mark.parametrize(("nodes", "mode"), [(1, None), (4, "Indexed")])
def test_one_pod_per_node(nodes: int, mode: str | None) -> None:
    job = built(nodes=nodes)["spec"]
    assert job["completions"] == job["parallelism"] == nodes
    assert job.get("completionMode") == mode


def test_metadata_labels_owner_and_finalizer() -> None:
    body = built()
    meta = body["metadata"]
    tags = {
        "dispatch.dev/job": "train",
        "dispatch.dev/submission": "3",
        "app.kubernetes.io/managed-by": "dispatch",
    }
    assert meta["name"] == "train-3"
    assert meta["labels"] == tags
    assert body["spec"]["template"]["metadata"]["labels"] == tags
    assert meta["finalizers"] == ["dispatch.dev/record-before-delete"]
    assert meta["ownerReferences"][0]["uid"] == "u"
    assert "ownerReferences" not in build(Target("ns", "train", 3), spec(), Plan(job="ns/train"))["metadata"]
    container = body["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["python", "t.py"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"


def test_without_options_the_field_is_named() -> None:
    with pytest.raises(BackendError, match=r"spec\.job"):
        build(TARGET, JobSpec(name="train", command=("x",)), Plan(job="ns/train"))


def test_env_names_kubernetes_refuses_are_refused_naming_the_field() -> None:
    """The model refuses them already; the builder checks again for options built without it."""
    options = JobOptions.model_construct(image="img:1", resources=Resources(), env={"A=B": "1"})
    job = JobSpec.model_construct(name="train", command=("x",), nodes=1, options={"job": options})
    with pytest.raises(Refused) as refused:
        build(TARGET, job, Plan(job="ns/train"))
    assert refused.value.field == "spec.job.env['A=B']"


def test_a_job_over_the_size_limit_is_refused() -> None:
    with pytest.raises(Refused, match="bytes"):
        built(command=tuple("x" * 4096 for _ in range(256)), env={f"E{i}": "y" * 32768 for i in range(60)})


def test_the_declaration_is_what_the_kind_reports() -> None:
    assert JOB.capabilities == BACKEND.capabilities
    assert BACKEND.name == JOB.name == "job"


def _subset(sent: Any, kept: Any, path: str = "") -> None:
    if isinstance(sent, dict):
        for key, value in sent.items():
            assert key in kept, f"{path}.{key} pruned by the API server"
            _subset(value, kept[key], f"{path}.{key}")
    elif isinstance(sent, list):
        assert len(sent) == len(kept), path
        for i, (a, b) in enumerate(zip(sent, kept, strict=True)):
            _subset(a, b, f"{path}[{i}]")
    else:
        assert sent == kept, path


@pytest.mark.parametrize(("name", "restart_left"), [("exit-never", None), ("restart-native", 1)])
def test_every_field_comes_back_from_the_api_server(name: str, restart_left: int | None) -> None:
    data = load(DATA, name)
    first = next(e["object"] for e in data["stream"] if e["resource"] == "jobs" and e["type"] == "ADDED")
    rules = (restart_rule(restart_left, 0),) if restart_left is not None else ()
    options = JobOptions(
        image="example.invalid/train:1",
        resources=Resources(cpu="1", memory="1Gi"),
        no_capacity_after_seconds=5,
    )
    sent = build(
        Target("job-record", name, 1),
        JobSpec(name=name, command=("python", "train.py"), options={"job": options}),
        Plan(job=f"job-record/{name}", rules=rules),
    )
    sent["spec"]["suspend"] = first["spec"]["suspend"]
    _subset(without_identity(sent), first)


def test_the_example_is_planned_with_the_job_controllers_native_rule() -> None:
    """examples/job-dispatchjob.yaml: its restart rule goes to the Job controller (backoffLimit 2 +
    podFailurePolicy), its resubmit rule to the supervisor."""
    body = yaml.safe_load((Path(__file__).parents[2] / "examples" / "job-dispatchjob.yaml").read_text())
    job_spec = _dispatchjob.job_spec(body)
    plan = make_plan("team-a/finetune-lora", job_spec, JOB.capabilities, supervised=True)
    assert [r.enforcer for r in plan.rules] == [Enforcer.SCHEDULER, Enforcer.SUPERVISOR]
    built_job = build(Target("team-a", "finetune-lora", 1), job_spec, plan)["spec"]
    assert built_job["backoffLimit"] == 2
    assert "podFailurePolicy" in built_job

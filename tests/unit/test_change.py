"""A rule's change: what each firing changes in the submission it authorizes, computed from the
record alone, shown by the plan, recorded on the submission, built into the next object by every
backend, and refused (naming the field) where the backend cannot make it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatch import (
    Action,
    Capabilities,
    Cause,
    CauseKind,
    Change,
    JobSpec,
    MemoryBackend,
    MemoryChange,
    PlanError,
    RecoveryPolicy,
    Rule,
    Shape,
    SlurmChange,
    SlurmOptions,
    TimeLimitChange,
    compose,
    simulate,
    spec_for,
)
from dispatch._backends.job import CAPABILITIES as JOB
from dispatch._backends.job import JobOptions
from dispatch._backends.job._adapter import build as build_job
from dispatch._backends.jobset import JobSetOptions
from dispatch._backends.jobset._adapter import build as build_jobset
from dispatch._backends.kubeflow import KubeflowOptions
from dispatch._backends.kubeflow._adapter import build as build_kubeflow
from dispatch._backends.slurm._adapter import open_adapter as open_slurm
from dispatch._backends.trainjob import TrainJobOptions
from dispatch._backends.trainjob._adapter import build as build_trainjob
from dispatch._change import changed, describe, effective_spec, field_changes, more_memory
from dispatch._cli import _render as render
from dispatch._controller import crd, events
from dispatch._controller.webhook import Refused, check
from dispatch._decide import Authorize, apply, decide
from dispatch._dispatchjob import SpecError, job_spec, record_status
from dispatch._model import FieldChange, OptionsModel, Plan, Record, Resources, quantity_bytes
from dispatch._plan import make_plan
from dispatch._workload import Target
from tests.support.builders import ALICE, dispatch_job, workload_options
from tests.support.records import T0

GIB = 1 << 30
OOM = Cause(kind=CauseKind.OUT_OF_MEMORY, detail="OOMKilled", exit_code=137, signal=9)
MORE = Change(memory=MemoryChange(factor=2, max="8Gi"))
"""Twice the memory per firing, at most 8Gi."""


def job(
    change: Change | None = MORE, *, budget: int = 3, options: dict[str, OptionsModel] | None = None
) -> JobSpec:
    """A job with 2Gi per node on Slurm (unless ``options`` say otherwise) whose one rule answers an
    out-of-memory kill with a resubmission changed by ``change``."""
    rule = Rule(on=(CauseKind.OUT_OF_MEMORY,), budget=budget, change=change)
    given_options = options or {"slurm": SlurmOptions(memory_per_node_mb=2048)}
    return JobSpec(
        name="train", command=("t",), recovery=RecoveryPolicy(rules=(rule,)), options=given_options
    )


def slurm_memory(spec: JobSpec) -> int | None:
    options = spec.options["slurm"]
    assert isinstance(options, SlurmOptions)
    return options.memory_per_node_mb


# ---- the core: what a firing changes ------------------------------------------------------------


@given(
    base=st.integers(1, 64),
    factor=st.integers(2, 4),
    cap=st.integers(1, 1024),
    firings=st.integers(0, 8),
)
def test_memory_after_k_firings_is_the_base_times_the_factor_to_the_k_capped(
    base: int, factor: int, cap: int, firings: int
) -> None:
    spec = job(
        Change(memory=MemoryChange(factor=factor, max=f"{max(cap, base)}Gi")),
        options={"kubeflow": KubeflowOptions(image="i", resources=Resources(memory=f"{base}Gi"))},
    )
    after = effective_spec(spec, [0] * firings).options["kubeflow"]
    assert after.memory_bytes() == min(max(cap, base), base * factor**firings) * GIB


@given(now=st.integers(1, 1 << 40), factor=st.floats(1.01, 16), cap=st.integers(1, 1 << 41))
def test_one_firing_never_lowers_the_memory_nor_passes_the_max(now: int, factor: float, cap: int) -> None:
    grown = more_memory(now, MemoryChange(factor=factor, max=str(cap)))
    assert grown >= now
    assert grown <= max(now, cap)


@given(rules=st.lists(st.one_of(st.none(), st.just(0)), max_size=8))
def test_the_spec_of_a_submission_depends_only_on_the_rules_before_it(rules: list[int | None]) -> None:
    """Changes apply to the submission a firing authorizes and the ones after it, never before; a
    submission authorized without a rule (None) changes nothing and keeps the earlier changes."""
    spec = job()
    firings = sum(r is not None for r in rules)
    assert slurm_memory(effective_spec(spec, rules)) == min(8192, 2048 << firings)
    for k in range(len(rules)):
        assert effective_spec(spec, rules[:k]) == effective_spec(effective_spec(spec, rules[:k]), [])


def test_another_partition_replaces_the_field_and_stays() -> None:
    spec = job(Change(slurm=SlurmChange(partition="big")))
    once = effective_spec(spec, [0])
    assert once.options["slurm"] == SlurmOptions(memory_per_node_mb=2048, partition="big")
    assert effective_spec(spec, [0, 0, None]) == once
    assert field_changes(spec, once)[0].model_dump(by_alias=True) == {
        "field": "spec.slurm.partition",
        "from": None,
        "to": "big",
    }


def test_a_backend_change_where_the_spec_has_no_options_builds_them() -> None:
    spec = JobSpec(
        name="t",
        command=("t",),
        recovery=RecoveryPolicy(
            rules=(
                Rule(on=(CauseKind.PREEMPTED,), budget=1, change=Change(slurm=SlurmChange(partition="p"))),
            )
        ),
    )
    assert changed(spec, spec.recovery.rules[0].change or MORE).options == {
        "slurm": SlurmOptions(partition="p")
    }


def test_kueue_fields_are_replaced() -> None:
    spec = JobSpec(
        name="t",
        command=("t",),
        queue="small",
        workload_priority_class="low",
        recovery=RecoveryPolicy(
            rules=(
                Rule(
                    on=(CauseKind.NO_CAPACITY,),
                    budget=1,
                    change=Change(queue="big", workload_priority_class="high"),
                ),
            )
        ),
    )
    after = effective_spec(spec, [0])
    assert (after.queue, after.workload_priority_class) == ("big", "high")
    assert [str(c) for c in field_changes(spec, after)] == [
        "spec.queue small -> big",
        "spec.workloadPriorityClass low -> high",
    ]


def test_kubernetes_memory_is_written_in_the_largest_exact_unit() -> None:
    spec = job(
        Change(memory=MemoryChange(factor=1.5, max="64Gi")),
        options={"job": JobOptions(image="i", resources=Resources(memory="4Gi"))},
    )
    options = [effective_spec(spec, [0] * k).options["job"] for k in range(1, 4)]
    assert [o.resources.memory for o in options if isinstance(o, JobOptions)] == ["6Gi", "9Gi", "13824Mi"]
    assert quantity_bytes("13824Mi") == int(4 * 1.5**3 * GIB)


def test_a_change_names_something() -> None:
    with pytest.raises(ValueError, match="at least one field"):
        Change()


# ---- the record: recorded on the submission, computed from the record alone ---------------------


def authorized_twice(spec: JobSpec) -> Record:
    plan = make_plan(spec.name, spec, JOB if "job" in spec.options else Capabilities(), supervised=True)
    record = Record(job="train", spec=spec, plan=plan, submitted_by=ALICE, submitted_at=T0, supervised=True)
    record = apply(record, Authorize(1), actor=ALICE, now=T0)
    record = apply(record, Authorize(2, 0, OOM), actor=ALICE, now=T0)
    return apply(record, Authorize(3, 0, OOM), actor=ALICE, now=T0)


def test_each_submission_records_what_changed_from_the_one_before() -> None:
    record = authorized_twice(job())
    assert [[str(c) for c in s.changes] for s in record.submissions] == [
        [],
        ["spec.slurm.memoryPerNodeMb 2048 -> 4096"],
        ["spec.slurm.memoryPerNodeMb 4096 -> 8192"],
    ]
    assert [slurm_memory(spec_for(record, n)) for n in (1, 2, 3)] == [2048, 4096, 8192]
    status = record_status(record)
    assert status["submissions"][2]["changes"] == [
        {"field": "spec.slurm.memoryPerNodeMb", "from": "4096", "to": "8192"}
    ]
    assert "changes" not in status["submissions"][0]  # a submission without changes reads as before


def test_a_record_read_back_gives_the_same_spec() -> None:
    """What a restarted operator reads (the status) computes the spec the object was built from."""
    record = authorized_twice(job())
    again = Record.model_validate({**record_status(record), "job": record.job, "spec": record.spec})
    assert again == record
    assert spec_for(again, 3) == spec_for(record, 3)


async def test_an_out_of_memory_kill_is_recovered_with_more_memory_in_the_next_object() -> None:
    backend = MemoryBackend(Shape.SLURM, auto_run=True)
    cluster = compose(backend)
    await cluster.operator.submit(job(budget=2), ALICE, supervised=True)
    supervisor = cluster.supervisor()
    await supervisor.drive("train")
    first = (await backend.list("train"))[0]
    backend.env.out_of_memory(first.id)
    await supervisor.drive("train")
    objects = await backend.list("train")
    assert [slurm_memory(backend.spec_of(o.id) or job()) for o in objects] == [2048, 4096]
    shown = await cluster.observer.get("train")
    assert [str(c) for c in shown.submissions[1].changes] == ["spec.slurm.memoryPerNodeMb 2048 -> 4096"]
    assert decide((await cluster.store.get("train")).record, objects).state.value == "running"


# ---- the plan and the refusals -------------------------------------------------------------------


def test_the_plan_shows_each_rules_change() -> None:
    plan = make_plan(
        "t",
        job(Change(memory=MemoryChange(factor=2, max="8Gi"), slurm=SlurmChange(partition="big"))),
        Capabilities(),
        supervised=True,
    )
    assert plan.rules[0].change == "memory x2 per firing, at most 8Gi; slurm.partition big"
    assert render.plan_lines(plan)[:2] == [
        "rule 0 is enforced by the supervisor",
        "  each firing changes the next submission: memory x2 per firing, at most 8Gi; slurm.partition big",
    ]


def test_a_restart_the_scheduler_would_enforce_with_a_change_is_refused_naming_the_field() -> None:
    rule = Rule(
        on=(CauseKind.NON_ZERO_EXIT, CauseKind.OUT_OF_MEMORY), action=Action.RESTART, budget=2, change=MORE
    )
    spec = JobSpec(
        name="t",
        command=("t",),
        recovery=RecoveryPolicy(rules=(rule,)),
        options={"job": JobOptions(image="i", resources=Resources(memory="1Gi"))},
    )
    with pytest.raises(PlanError, match=r"spec\.recovery\.rules\[0\]\.change: .* changes nothing"):
        make_plan("t", spec, JOB, supervised=True)
    as_resubmit = spec.model_copy(
        update={"recovery": RecoveryPolicy(rules=(rule.model_copy(update={"action": Action.RESUBMIT}),))}
    )
    assert make_plan("t", as_resubmit, JOB, supervised=True).rules[0].enforcer.value == "supervisor"


@pytest.mark.parametrize(
    ("change", "options", "field", "words"),
    [
        (MORE, {"job": JobOptions(image="i")}, "change.memory", "set spec.job.resources.memory"),
        (MORE, {}, "change.memory", "the backend's options hold no memory"),
        (
            Change(memory=MemoryChange(factor=2, max="1Gi")),
            {"job": JobOptions(image="i", resources=Resources(memory="2Gi"))},
            "change.memory.max",
            "less than spec.job.resources.memory (2Gi)",
        ),
        (Change(queue="big"), {"job": JobOptions(image="i")}, "change.queue", "needs spec.queue"),
        (Change(workload_priority_class="high"), {}, "change.workloadPriorityClass", "needs spec.queue"),
    ],
)
def test_a_change_the_backend_cannot_make_is_refused_naming_the_field(
    change: Change, options: dict[str, OptionsModel], field: str, words: str
) -> None:
    spec = (
        job(change, options=options)
        if options
        else JobSpec(
            name="t",
            command=("t",),
            recovery=RecoveryPolicy(rules=(Rule(on=(CauseKind.OUT_OF_MEMORY,), budget=1, change=change),)),
        )
    )
    with pytest.raises(PlanError) as refused:
        make_plan("t", spec, JOB, supervised=True)
    assert refused.value.field == f"spec.recovery.rules[0].{field}"
    assert words in str(refused.value)


def test_a_queue_change_where_kueue_cannot_queue_is_refused() -> None:
    spec = job(Change(queue="big")).model_copy(update={"queue": "small"})
    with pytest.raises(PlanError) as refused:
        make_plan("t", spec, Capabilities(), supervised=True)
    assert refused.value.field == "spec.recovery.rules[0].change.queue"
    assert "Kueue cannot queue" in str(refused.value)


# ---- the DispatchJob: the webhook, the CRD, the plugin --------------------------------------------


def oom_rule(change: dict[str, Any]) -> dict[str, Any]:
    return {"recovery": {"rules": [{"on": ["out-of-memory"], "budget": 2, "change": change}]}}


def test_the_webhook_takes_slurms_partition_change() -> None:
    body = dispatch_job(
        backend="slurm",
        backend_options={"memoryPerNodeMb": 1024},
        **oom_rule({"slurm": {"partition": "big"}, "memory": {"factor": 2, "max": "4Gi"}}),
    )
    check(body, None, "CREATE")
    spec = job_spec(body)
    assert spec.recovery.rules[0].change == Change(
        memory=MemoryChange(factor=2, max="4Gi"), slurm=SlurmChange(partition="big")
    )


@pytest.mark.parametrize(
    ("backend", "options", "change", "message"),
    [
        (
            "job",
            workload_options("job"),
            {"slurm": {"partition": "big"}},
            "spec.recovery.rules[0].change.slurm: backend job is not slurm",
        ),
        (
            "slurm",
            {},
            {"slurm": {"partition": ""}},
            "spec.recovery.rules[0].change.slurm.partition: String should have at least 1 character",
        ),
        (
            "slurm",
            {},
            {"slurm": {"account": "x"}},
            "spec.recovery.rules[0].change.slurm.account: Extra inputs",
        ),
        (
            "kubeflow",
            workload_options("kubeflow"),
            {"queue": "big"},
            "spec.recovery.rules[0].change.queue is refused: a change of Kueue's fields needs spec.queue",
        ),
        (
            "job",
            workload_options("job", resources={"cpu": "1"}),
            {"memory": {"factor": 2, "max": "4Gi"}},
            "spec.recovery.rules[0].change.memory is refused: no memory of each node is set to change "
            "(set spec.job.resources.memory)",
        ),
        (
            "slurm",
            {},
            {"memory": {"factor": 1, "max": "4Gi"}},
            "spec.recovery.rules[0].change.memory.factor: Input should be greater than 1",
        ),
        ("slurm", {}, {}, "a change names at least one field to change"),
    ],
)
def test_the_webhook_refuses_a_change_the_backend_cannot_make_naming_the_field(
    backend: str, options: dict[str, Any], change: dict[str, Any], message: str
) -> None:
    body = dispatch_job(backend=backend, backend_options=options, **oom_rule(change))
    with pytest.raises(Refused) as refused:
        check(body, None, "CREATE")
    assert message in str(refused.value)


def test_the_crd_holds_each_backends_change_and_no_core_options() -> None:
    spec = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    change = spec["properties"]["recovery"]["properties"]["rules"]["items"]["properties"]["change"]
    assert set(change["properties"]) == {"memory", "queue", "workloadPriorityClass", "slurm"}
    assert set(change["properties"]["slurm"]["properties"]) == {"partition"}
    # The API server's OpenAPI v3 takes an exclusive bound as a boolean beside the bound (draft 4).
    factor = change["properties"]["memory"]["properties"]["factor"]
    assert (factor["minimum"], factor["exclusiveMinimum"], factor["maximum"]) == (1, True, 16)


def test_describe_shows_what_each_submission_changed() -> None:
    body = dispatch_job(
        "train",
        namespace="ns",
        backend="slurm",
        backend_options={"memoryPerNodeMb": 2048},
        **oom_rule({"memory": {"factor": 2, "max": "8Gi"}}),
    )
    record = authorized_twice(job_spec(body))
    body["status"] = record_status(record)
    text = render.describe_text(render.describe_data(body))
    assert "  submission 3 changed spec.slurm.memoryPerNodeMb 4096 -> 8192" in text.splitlines()
    assert (
        "    each firing changes the next submission: memory x2 per firing, at most 8Gi" in text.splitlines()
    )


# ---- every backend builds its object from the submission's spec ----------------------------------

TARGET = Target("ns", "train", 2)
KIT: dict[str, tuple[Callable[[Target, JobSpec, Plan], dict[str, Any]], type[OptionsModel]]] = {
    "job": (build_job, JobOptions),
    "jobset": (build_jobset, JobSetOptions),
    "kubeflow": (build_kubeflow, KubeflowOptions),
    "trainjob": (build_trainjob, TrainJobOptions),
}


def memories(node: object) -> list[str]:
    """Every container's memory request and limit in a built object."""
    found: list[str] = []
    if isinstance(node, dict):
        for key in ("resources", "resourcesPerNode"):  # a TrainJob's trainer: resourcesPerNode
            resources = node.get(key)
            for part in ("requests", "limits"):
                memory = (
                    ((resources or {}).get(part) or {}).get("memory") if isinstance(resources, dict) else None
                )
                if memory is not None:
                    found.append(memory)
        for value in node.values():
            found.extend(memories(value))
    elif isinstance(node, list):
        for item in node:
            found.extend(memories(item))
    return found


@pytest.mark.parametrize("backend", sorted(KIT))
def test_each_kit_kind_builds_the_submissions_memory(backend: str) -> None:
    build, model = KIT[backend]
    options = model.model_validate(workload_options(backend, resources={"memory": "2Gi"}))
    spec = job(MORE, options={backend: options})
    second = effective_spec(spec, [0])
    built = build(TARGET, second, Plan(job="ns/train"))
    assert memories(built)
    assert set(memories(built)) == {"4Gi"}
    assert set(memories(build(TARGET, spec, Plan(job="ns/train")))) == {"2Gi"}


def test_slurm_submits_the_submissions_memory_and_partition() -> None:
    backend = open_slurm({"url": "http://slurm.test", "partition": "default"})
    spec = job(Change(memory=MemoryChange(factor=2, max="8Gi"), slurm=SlurmChange(partition="big")))
    first = backend.submit_request("train", 1, spec)
    second = backend.submit_request("train", 2, effective_spec(spec, [0]))
    assert (first.memory_per_node_mb, first.partition) == (2048, "default")
    assert (second.memory_per_node_mb, second.partition) == (4096, "big")


def test_describe_words_of_a_change() -> None:
    assert describe(Change(queue="q", workload_priority_class="p")) == "queue q; workloadPriorityClass p"


def test_a_job_spec_error_names_the_change_field() -> None:
    body = dispatch_job(backend="slurm", **oom_rule({"slurm": {"partition": 3}}))
    with pytest.raises(SpecError, match=r"spec\.recovery\.rules\[0\]\.change\.slurm\.partition"):
        job_spec(body)


def test_the_recovering_event_says_what_the_submission_runs_with() -> None:
    record = authorized_twice(job())
    before = record.model_copy(update={"submissions": record.submissions[:2]})
    described = events.describe(Authorize(3, 0, OOM), before, record)
    assert described is not None
    assert described[3].endswith("; it runs with spec.slurm.memoryPerNodeMb 4096 -> 8192")


@pytest.mark.parametrize(
    "given",
    [{}, {"memory": None}, {"slurm": SlurmChange()}, {"options": {"slurm": SlurmChange(partition=None)}}],
)
def test_a_change_that_names_nothing_is_refused(given: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="names at least one field"):
        Change(**given)


# ---- a longer time limit ----------------------------------------------------------------------------


def timed(limit: int | None, change: TimeLimitChange) -> JobSpec:
    rule = Rule(on=(CauseKind.TIME_LIMIT,), budget=3, change=Change(time_limit=change))
    return JobSpec(
        name="train",
        command=("t",),
        time_limit_seconds=limit,
        recovery=RecoveryPolicy(rules=(rule,)),
        options={"slurm": SlurmOptions()},
    )


@given(
    base=st.integers(1, 100_000),
    factor=st.sampled_from([1.5, 2.0, 3.0]),
    cap=st.integers(1, 400_000),
    firings=st.integers(0, 6),
)
def test_each_firing_lengthens_the_time_limit_up_to_its_max(
    base: int, factor: float, cap: int, firings: int
) -> None:
    spec = timed(base, TimeLimitChange(factor=factor, max_seconds=max(cap, base)))
    got = effective_spec(spec, [0] * firings).time_limit_seconds
    want = base
    for _ in range(firings):
        want = max(want, min(max(cap, base), int(want * factor)))
    assert got == want


def test_a_time_limit_change_is_recorded_and_simulated() -> None:
    spec = timed(600, TimeLimitChange(factor=2, max_seconds=1800))
    assert [effective_spec(spec, [0] * k).time_limit_seconds for k in range(4)] == [600, 1200, 1800, 1800]
    assert field_changes(
        spec, changed(spec, Change(time_limit=TimeLimitChange(factor=2, max_seconds=1800)))
    ) == (FieldChange(field="spec.timeLimitSeconds", from_="600", to="1200"),)
    assert describe(Change(time_limit=TimeLimitChange(factor=2, max_seconds=1800))) == (
        "timeLimitSeconds x2 per firing, at most 1800"
    )
    plan = make_plan("train", spec, MemoryBackend(Shape.SLURM).capabilities, supervised=True)
    sim = simulate(spec, plan, ["time-limit", "time-limit"])
    assert [e.change for e in sim.ends] == [
        "spec.timeLimitSeconds 600 -> 1200",
        "spec.timeLimitSeconds 1200 -> 1800",
        "",
    ]


@pytest.mark.parametrize(
    ("limit", "cap", "field", "words"),
    [
        (None, 1800, "change.timeLimit", "set spec.timeLimitSeconds"),
        (3600, 1800, "change.timeLimit.maxSeconds", "would never grow"),
    ],
)
def test_a_time_limit_change_it_cannot_make_is_refused(
    limit: int | None, cap: int, field: str, words: str
) -> None:
    spec = timed(limit, TimeLimitChange(factor=2, max_seconds=cap))
    with pytest.raises(PlanError) as refused:
        make_plan("t", spec, MemoryBackend(Shape.SLURM).capabilities, supervised=True)
    assert refused.value.field == f"spec.recovery.rules[0].{field}"
    assert words in str(refused.value)

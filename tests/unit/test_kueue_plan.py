"""Kueue in front, the plan's side: ``spec.queue`` and ``spec.workloadPriorityClass``
are accepted only where Kueue can queue the backend's objects, the plan says what Kueue enforces
and what stays dispatch's, and Kueue's own label on a DispatchJob is refused naming the field."""

from __future__ import annotations

import io
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from dispatch import JobSpec, MemoryBackend, PlanError, _dispatchjob, _registry, make_plan
from dispatch._backends._kit import KUEUE_WORKLOAD_RULE
from dispatch._cli import _render as render
from dispatch._cli.main import main
from dispatch._constants import KUEUE_LABEL_QUEUE
from dispatch._model import DISPATCH_ENFORCES_WITH_KUEUE, KUEUE_ENFORCES, QueuePlan
from tests.support import builders

KUEUE_KINDS = {"kubeflow", "job", "jobset", "trainjob"}
"""The backends whose kinds Kueue v0.17.0 integrates (pkg/controller/jobs: job, kubeflow pytorchjob,
jobset, trainjob), written out here independently of the declarations under test."""
NAMES = st.from_regex(r"[a-z0-9]([-a-z0-9.]{0,20}[a-z0-9])?", fullmatch=True)


def spec(queue: str | None = "team-a", priority: str | None = None) -> JobSpec:
    return JobSpec(name="finetune", command=("train",), queue=queue, workload_priority_class=priority)


def test_exactly_the_kueue_kinds_can_be_queued() -> None:
    queueable = {b.name for b in _registry.spec_backends() if b.capabilities.queues}
    assert queueable == KUEUE_KINDS


@pytest.mark.parametrize("name", sorted(b.name for b in _registry.spec_backends()))
def test_only_a_queueable_backend_is_granted_kueues_workloads(name: str) -> None:
    info = _registry.get(name)
    assert info is not None
    workloads = [r for r in info.rbac if "workloads" in r.resources]
    if name in KUEUE_KINDS:
        assert workloads == [KUEUE_WORKLOAD_RULE]
        assert KUEUE_WORKLOAD_RULE.api_groups == ("kueue.x-k8s.io",)
        assert set(KUEUE_WORKLOAD_RULE.verbs) == {"get", "list", "watch"}  # read only
    else:
        assert workloads == []


@given(queue=NAMES, priority=st.none() | NAMES, backend=st.sampled_from(sorted(_registry.registered())))
def test_the_plan_queues_where_kueue_can_and_refuses_naming_the_field_elsewhere(
    queue: str, priority: str | None, backend: str
) -> None:
    info = _registry.get(backend)
    assert info is not None
    job = spec(queue, priority)
    if info.capabilities.queues:
        plan = make_plan("ns/finetune", job, info.capabilities, supervised=True)
        assert plan.queue == QueuePlan(queue=queue, workload_priority_class=priority)
        assert plan.queue.kueue == KUEUE_ENFORCES
        assert plan.queue.dispatch == DISPATCH_ENFORCES_WITH_KUEUE
    else:
        with pytest.raises(PlanError) as caught:
            make_plan("ns/finetune", job, info.capabilities, supervised=True)
        assert (caught.value.rule, caught.value.field) == (None, "spec.queue")
        assert str(caught.value).startswith("spec.queue is refused: Kueue cannot queue")


@pytest.mark.parametrize("shape", ["slurm", "kubeflow", "job", "jobset", "trainjob"])
def test_the_memory_scheduler_never_queues(shape: str) -> None:
    # It imitates the backend's native rules, not Kueue: a queued job would run unqueued.
    backend = MemoryBackend(shape)
    assert not backend.capabilities.queues
    with pytest.raises(PlanError):
        make_plan("finetune", spec(), backend.capabilities, supervised=True)


def test_no_queue_no_kueue_in_the_plan_or_the_status() -> None:
    info = _registry.get("job")
    assert info is not None
    plan = make_plan("ns/finetune", spec(None), info.capabilities, supervised=True)
    assert plan.queue is None
    assert "queue" not in plan.model_dump(exclude_none=True)


@pytest.mark.parametrize("bad", ["Team", "-a", "a" * 64, "a_b", ""])
def test_a_queue_name_kueue_would_refuse_is_refused(bad: str) -> None:
    with pytest.raises(ValidationError, match="queue"):
        spec(bad)


def test_a_priority_class_needs_a_queue() -> None:
    with pytest.raises(ValidationError, match="workloadPriorityClass"):
        spec(None, "high")


def body(**meta: object) -> dict[str, object]:
    return {
        "metadata": {"name": "finetune", "namespace": "ns", **meta},
        "spec": {"backend": "job", "command": ["train"], "job": {"image": "pytorch:2"}, "queue": "team-a"},
    }


def test_the_codec_reads_queue_and_priority_class() -> None:
    b = body()
    b["spec"] = {**b["spec"], "workloadPriorityClass": "high"}  # type: ignore[dict-item]
    parsed = _dispatchjob.job_spec(b)
    assert (parsed.queue, parsed.workload_priority_class) == ("team-a", "high")


def test_kueues_label_on_a_dispatchjob_is_refused_naming_the_field() -> None:
    with pytest.raises(_dispatchjob.SpecError) as caught:
        _dispatchjob.job_spec(body(labels={KUEUE_LABEL_QUEUE: "team-a"}))
    message = str(caught.value)
    assert message.startswith(f"metadata.labels[{KUEUE_LABEL_QUEUE}]: ")
    assert "spec.queue" in message


def manifest(backend: str, **spec: Any) -> str:
    options = {"image": "pytorch:2"} if backend != "slurm" else None
    return builders.manifest(backend=backend, command=["train"], backend_options=options, **spec)


def plan_cli(text: str, monkeypatch: pytest.MonkeyPatch, *extra: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr("sys.stdin", io.StringIO(text))
    code = main(["plan", "-f", "-", "-n", "ns", *extra], stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_kubectl_dispatch_plan_shows_kueues_part(monkeypatch: pytest.MonkeyPatch) -> None:
    text = manifest("kubeflow", queue="team-a", workloadPriorityClass="high")
    code, out, err = plan_cli(text, monkeypatch)
    assert (code, err) == (0, "")
    assert out.splitlines()[1:] == [
        "queued by Kueue in LocalQueue team-a, priority class high",
        "  enforced by Kueue: admission, quota, preemption",
        "  enforced by dispatch: the rules' budgets, recovery, the record",
    ]
    code, out, _ = plan_cli(text, monkeypatch, "-o", "json")
    assert yaml.safe_load(out)["queue"]["queue"] == "team-a"


def test_kubectl_dispatch_plan_refuses_a_queue_on_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, err = plan_cli(manifest("slurm", queue="team-a"), monkeypatch)
    assert (code, out) == (1, "")
    assert err.startswith("refused: spec.queue is refused: Kueue cannot queue")
    code, out, _ = plan_cli(manifest("slurm", queue="team-a"), monkeypatch, "-o", "json")
    assert yaml.safe_load(out)["refused"]["field"] == "spec.queue"


def test_kubectl_dispatch_describe_shows_kueues_part_from_the_status() -> None:
    b = body()
    b["metadata"] = {**b["metadata"], "creationTimestamp": "2026-12-01T00:00:00Z"}  # type: ignore[dict-item]
    parsed = _dispatchjob.job_spec(b)
    info = _registry.get("job")
    assert info is not None
    plan = make_plan("ns/finetune", parsed, info.capabilities, supervised=True)
    status = _dispatchjob.record_status(_dispatchjob.new_record(b, parsed, plan))
    assert status["plan"]["queue"]["queue"] == "team-a"  # in the record, so in status
    text = render.describe_text(render.describe_data({**b, "status": status}))
    assert "  queued by Kueue in LocalQueue team-a" in text
    assert "    enforced by Kueue: admission, quota, preemption" in text


def test_the_refusal_event_of_a_queue_says_queue_refused() -> None:
    import asyncio

    from dispatch._constants import REASON_UNQUEUEABLE
    from dispatch._controller.events import EventRecorder

    posted: list[dict[str, object]] = []

    async def post(namespace: str, event: dict[str, object]) -> None:
        posted.append(event)

    with pytest.raises(PlanError) as caught:
        make_plan("ns/finetune", spec(), MemoryBackend("job").capabilities, supervised=True)

    async def go() -> None:
        recorder = EventRecorder(post)
        recorder.refused("ns/finetune", caught.value)
        await recorder.drain()

    asyncio.run(go())
    assert [e["reason"] for e in posted] == [REASON_UNQUEUEABLE]
    assert str(posted[0]["note"]).startswith("refused: spec.queue is refused: Kueue cannot queue")

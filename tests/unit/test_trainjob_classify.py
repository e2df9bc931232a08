"""Classification of TrainJobs on TrainJob, JobSet, Job and Pod JSON recorded from the real stack.

Each file in tests/unit/data/trainjob/ (recorded by hack/record.py trainjob from the lab with
Kubeflow Trainer v2.2.0, its torch-distributed ClusterTrainingRuntime and JobSet v0.11.1) holds the
watch events of one TrainJob, the JobSet the Trainer built for it, its Jobs and pods, in arrival
order, and the events Kubernetes wrote. The `trainjob` backend's watch handlers are fed the
TrainJob's and the pods' events, and its ``list()`` must give the cause the table says.

What the recordings show of the Trainer: its runtimes' pods are ``restartPolicy: OnFailure`` and
their Jobs keep the default ``backoffLimit`` (6), and a TrainJob cannot change either, so an exit
or an OOM is a restart in place by the kubelet and a preempted pod is replaced by its Job: the
TrainJob is never Failed. Every such failure is the end of the submission for dispatch (the kit
stops the TrainJob), since no rule of the plan is enforced by the Trainer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dispatch._backends.trainjob._adapter import TRAINJOB, TrainJobBackend
from dispatch._model import CauseKind, ObjectView, Phase
from dispatch._workload import WorkloadBackend, classify
from tests.support.classified import assert_classified
from tests.support.recorded import final, late_clock, load, names, orders, replay, watched

DATA = Path(__file__).parent / "data" / "trainjob"
RESOURCE = "trainjobs.trainer.kubeflow.org"
Body = dict[str, Any]

# scenario -> (phase, cause, exit code, a word of the detail)
EXPECTED: dict[str, tuple[Phase, CauseKind, int | None, str]] = {
    "success": (Phase.ENDED, CauseKind.NONE, None, "jobset completed successfully"),
    "exit": (Phase.ENDED, CauseKind.NON_ZERO_EXIT, 1, "exited with code 1"),
    "oom": (Phase.ENDED, CauseKind.OUT_OF_MEMORY, 137, "OOMKilled"),
    "preempt": (Phase.ENDED, CauseKind.PREEMPTED, None, "Preempt"),
    "evict": (Phase.ENDED, CauseKind.PREEMPTED, None, "EvictionByEvictionAPI"),
}


def recording(name: str) -> Body:
    return watched(DATA, name, RESOURCE)


def recordings() -> list[str]:
    return names(DATA)


def check(name: str, view: ObjectView) -> None:
    assert_classified(view, (*EXPECTED[name], 0))


def test_every_scenario_is_recorded() -> None:
    assert recordings() == sorted(EXPECTED)


@pytest.mark.parametrize("order", ["as-recorded", "pod-watch-first", f"{RESOURCE}-watch-first"])
@pytest.mark.parametrize("name", sorted(EXPECTED))
async def test_cause_from_the_watches_whichever_lags(
    observer: list[WorkloadBackend], name: str, order: str
) -> None:
    data = recording(name)
    check(
        name, await replay(TrainJobBackend, observer, data, orders(data, RESOURCE)[order], resource=RESOURCE)
    )


@pytest.mark.parametrize("name", ["exit", "oom", "preempt", "evict"])
def test_the_trainer_never_fails_it_by_itself(name: str) -> None:
    """What makes every rule the supervisor's: the TrainJob was never Failed, and its pods were
    restarted in place (OnFailure) or replaced by their Job (backoffLimit 6, the runtime's)."""
    data = load(DATA, name)
    trainjob = final(data, RESOURCE)[0]
    assert not any(c["type"] == "Failed" for c in trainjob["status"].get("conditions") or ())
    jobset = final(data, "jobsets.jobset.x-k8s.io")[0]
    template = jobset["spec"]["replicatedJobs"][0]["template"]
    assert template["spec"]["template"]["spec"]["restartPolicy"] == "OnFailure"
    assert template["spec"].get("backoffLimit") in (None, 6)
    pods = [e["object"] for e in data["stream"] if e["resource"] == "pods"]
    restarted = any(c.get("restartCount") for p in pods for c in p["status"].get("containerStatuses") or ())
    replaced = len({p["metadata"]["uid"] for p in pods}) > 2
    assert restarted or replaced


def test_the_runtime_patch_labels_the_pods() -> None:
    """dispatch's labels reach the pods through the TrainJob's runtimePatches (the kit finds them so)."""
    data = load(DATA, "success")
    pods = [e["object"] for e in data["stream"] if e["resource"] == "pods"]
    assert pods
    for pod in pods:
        labels = pod["metadata"]["labels"]
        assert labels["dispatch.dev/job"] == "success"
        assert labels["dispatch.dev/submission"] == "1"
        assert labels["app.kubernetes.io/managed-by"] == "dispatch"


def test_a_preempted_pod_is_the_end_although_its_job_replaces_it() -> None:
    """The Job creates a replacement for the preempted pod; the pod's DisruptionTarget is the end of
    the submission: the kit is told to stop the TrainJob."""
    data = recording("preempt")
    stream = data["stream"]
    trainjob = next(e["object"] for e in reversed(stream) if e["resource"] == RESOURCE)
    pods: dict[str, Body] = {}
    for event in stream:
        if event["resource"] == "pods" and event["type"] != "DELETED":
            pods[event["object"]["metadata"]["name"]] = event["object"]
    verdict = classify(TRAINJOB, trainjob, list(pods.values()), now=late_clock(data))
    assert verdict.stop is not None
    assert verdict.stop.kind is CauseKind.PREEMPTED

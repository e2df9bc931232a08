"""The lab's Kueue: its configuration (tests/support/lab.py) and what each recording of the real
Kueue holds (tests/unit/data/kueue, made by hack/record.py kueue), so a re-recording that lost its
scenario's signal fails here rather than silently weakening the classify tests built on it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.kueue import queue_objects
from tests.support.lab import KUEUE_FRAMEWORKS, kueue_config

DATA = Path(__file__).parent / "data" / "kueue"
PORTS = {"probe": 1, "metrics": 2, "webhook": 3}


def test_the_config_keeps_everything_on_loopback_and_its_cert_dir_in_the_lab(tmp_path: Path) -> None:
    cfg = kueue_config(ports=PORTS, cert_dir=tmp_path / "certs", frameworks=list(KUEUE_FRAMEWORKS.values()))
    assert cfg["apiVersion"] == "config.kueue.x-k8s.io/v1beta2"
    assert cfg["webhook"] == {"port": 3, "host": "127.0.0.1", "certDir": str(tmp_path / "certs")}
    assert cfg["health"]["healthProbeBindAddress"] == "127.0.0.1:1"
    assert cfg["metrics"]["bindAddress"] == "127.0.0.1:2"
    assert "/tmp/k8s-webhook-server" not in json.dumps(cfg)
    assert cfg["manageJobsWithoutQueueName"] is False
    assert cfg["waitForPodsReady"]["timeout"]
    assert cfg["integrations"]["frameworks"] == [
        "batch/job",
        "kubeflow.org/pytorchjob",
        "jobset.x-k8s.io/jobset",
        "trainer.kubeflow.org/trainjob",
    ]


def test_without_the_extras_kueue_manages_jobs_only(tmp_path: Path) -> None:
    cfg = kueue_config(ports=PORTS, cert_dir=tmp_path, frameworks=[])
    assert cfg["integrations"]["frameworks"] == ["batch/job"]


def test_the_queues_are_the_tests_own_and_preempt_as_the_issue_says() -> None:
    queues, docs = queue_objects("t-ns")
    cqs = [d for d in docs if d["kind"] == "ClusterQueue"]
    assert [c["metadata"]["name"] for c in cqs] == [queues.cluster_queue, queues.other_cluster_queue]
    assert {c["spec"]["cohortName"] for c in cqs} == {"t-ns"}
    for cq in cqs:
        assert cq["spec"]["preemption"] == {
            "withinClusterQueue": "LowerPriority",
            "reclaimWithinCohort": "Any",
        }
        assert cq["spec"]["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "t-ns"}}
    first = cqs[0]["spec"]["resourceGroups"][0]["flavors"][0]["resources"]
    assert all(r["borrowingLimit"] == "0" for r in first)  # preempts rather than borrows
    locals_ = {d["metadata"]["name"]: d["spec"]["clusterQueue"] for d in docs if d["kind"] == "LocalQueue"}
    assert locals_ == {queues.queue: queues.cluster_queue, queues.other_queue: queues.other_cluster_queue}


def _workload_conditions(recording: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (c["type"], c["status"], c.get("reason", ""))
        for e in recording["stream"]
        if e["resource"].startswith("workloads.")
        and e["object"]["metadata"]["name"].startswith("pytorchjob-")
        for c in (e["object"].get("status") or {}).get("conditions") or ()
    }


@pytest.mark.parametrize(
    ("scenario", "signals"),
    [
        ("admitted", {("Admitted", "True", "Admitted"), ("Finished", "True", "Succeeded")}),
        ("pending-quota", {("QuotaReserved", "False", "Pending")}),
        ("preempted", {("Evicted", "True", "Preempted"), ("Preempted", "True", "InClusterQueue")}),
        ("reclaimed", {("Evicted", "True", "Preempted"), ("Preempted", "True", "InCohortReclamation")}),
        ("pods-ready-timeout", {("Evicted", "True", "PodsReadyTimeout")}),
        ("deactivated", {("Evicted", "True", "Deactivated")}),
    ],
)
def test_each_recording_holds_its_scenarios_signal(scenario: str, signals: set[tuple[str, str, str]]) -> None:
    recording = json.loads((DATA / f"{scenario}.json").read_text())
    assert recording["kueue"] == "v0.17.0"
    assert signals <= _workload_conditions(recording)
    if scenario != "admitted":
        assert ("Finished", "True", "Succeeded") not in _workload_conditions(recording)

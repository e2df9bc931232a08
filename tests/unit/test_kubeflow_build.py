"""The PyTorchJob builder, table-style, and checked against what the real stack kept of its output.

The recorded files (tests/unit/data/kubeflow/, re-recorded by hack/record.py kubeflow from a lab with
the real API server and training operator) hold the PyTorchJob as the API server returned it: every
field the builder writes must come back unchanged (the upstream CRD prunes unknown fields silently).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from dispatch import KubeflowOptions
from dispatch._backends.kubeflow._adapter import refused_for_good
from dispatch._backends.kubeflow._kind import build
from dispatch._kubeclient import KubeError
from dispatch._model import (
    JobSpec,
    Plan,
    PlannedRule,
    Resources,
)
from dispatch._workload import Refused, Target
from dispatch._workload._kind import MAX_OBJECT_BYTES
from tests.support.builders import (
    RESUBMIT,
    build_options,
    job_spec,
    owner_reference,
    restart_rule,
    without_identity,
)

DATA = Path(__file__).parent / "data" / "kubeflow"


def spec(
    nodes: int = 2, env: dict[str, str] | None = None, command: tuple[str, ...] = ("python", "t.py")
) -> JobSpec:
    return job_spec("kubeflow", build_options(KubeflowOptions, env), command=command, nodes=nodes)


def built(plan_rules: tuple[PlannedRule, ...], **kw: Any) -> dict[str, Any]:
    owner = owner_reference(uid="uid-1", controller=True)
    return build(Target("ns", "train", 3, owner), spec(**kw), Plan(job="ns/train", rules=plan_rules))


@pytest.mark.parametrize(
    ("rules", "policy", "backoff", "budget_annotation"),
    [
        ((), "Never", None, None),
        ((RESUBMIT,), "Never", None, None),
        ((restart_rule(3, 0),), "OnFailure", 4, "3"),
        # The budget belongs to the job: a later submission may restart only what is left.
        ((restart_rule(3, 2),), "OnFailure", 2, "1"),
        # Nothing left: no restart in place at all (OnFailure would restart once before failing).
        ((restart_rule(3, 3),), "Never", None, "0"),
        ((restart_rule(0, 0),), "Never", None, "0"),
    ],
)
def test_restart_policy_and_backoff_limit_from_what_is_left(
    rules: tuple[PlannedRule, ...], policy: str, backoff: int | None, budget_annotation: str | None
) -> None:
    body = built(rules)
    replicas = body["spec"]["pytorchReplicaSpecs"]
    assert {r["restartPolicy"] for r in replicas.values()} == {policy}
    assert body["spec"]["runPolicy"].get("backoffLimit") == backoff
    assert body["metadata"]["annotations"].get("dispatch.dev/restart-budget") == budget_annotation


@pytest.mark.parametrize(("nodes", "workers"), [(1, None), (2, 1), (5, 4)])
def test_replicas(nodes: int, workers: int | None) -> None:
    replicas = built((), nodes=nodes)["spec"]["pytorchReplicaSpecs"]
    assert replicas["Master"]["replicas"] == 1
    assert (replicas.get("Worker") or {}).get("replicas") == workers


def test_held_tagged_owned() -> None:
    body = built(())
    meta = body["metadata"]
    assert meta["name"] == "train-3"
    assert meta["labels"] == {
        "dispatch.dev/job": "train",
        "dispatch.dev/submission": "3",
        "app.kubernetes.io/managed-by": "dispatch",
    }
    assert meta["ownerReferences"][0]["uid"] == "uid-1"
    assert body["spec"]["runPolicy"]["suspend"] is True
    container = body["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    assert container["name"] == "pytorch"
    assert container["resources"] == {
        "requests": {"cpu": "2", "memory": "4Gi"},
        "limits": {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "1"},
    }


@pytest.mark.parametrize(
    ("name", "accepted"),
    [
        ("A=B", False),
        ("bad\tname", False),
        ("\u00e9", False),
        ("MY_VAR", True),
        ("my.env-name", True),
        ("1abc", True),
    ],
)
def test_env_names_kubernetes_refuses_are_refused_before_anything_is_created(
    name: str, accepted: bool
) -> None:
    """The recording env-refused shows the real API server accepting such a PyTorchJob and refusing
    every pod of it; dispatch refuses the name up front, naming the field (the spec's validation
    where it checks env names, else the builder)."""
    if accepted:
        built((), env={name: "x"})
        return
    with pytest.raises((ValidationError, Refused)) as refused:
        built((), env={name: "x"})
    assert "env" in str(refused.value)


def test_over_the_size_limit_is_refused_naming_the_spec() -> None:
    big = {f"V{i}": "x" * 30000 for i in range(60)}
    with pytest.raises(Refused) as refused:
        built((), env=big)
    assert refused.value.field == "spec"
    assert str(MAX_OBJECT_BYTES) in str(refused.value)


def _recorded() -> list[Path]:
    return sorted(p for p in DATA.glob("*.json") if "create" not in json.loads(p.read_text()))


def _subset(sent: Any, kept: Any, path: str = "") -> list[str]:
    if isinstance(sent, dict):
        if not isinstance(kept, dict):
            return [path]
        return [m for k, v in sent.items() for m in _subset(v, kept.get(k), f"{path}.{k}")]
    if isinstance(sent, list):
        if not isinstance(kept, list) or len(kept) != len(sent):
            return [path]
        return [
            m for i, (a, b) in enumerate(zip(sent, kept, strict=True)) for m in _subset(a, b, f"{path}[{i}]")
        ]
    return [] if sent == kept else [path]


@pytest.mark.parametrize("path", _recorded(), ids=lambda p: p.stem)
def test_the_real_api_server_keeps_every_field_the_builder_writes(path: Path) -> None:
    data = json.loads(path.read_text())
    first = next(e["object"] for e in data["stream"] if e["resource"] == "pytorchjobs")
    name = first["metadata"]["name"]
    job, _, n = name.rpartition("-")
    rules = (
        (restart_rule(int(first["metadata"]["annotations"]["dispatch.dev/restart-budget"]), 0),)
        if ("dispatch.dev/restart-budget" in first["metadata"]["annotations"])
        else ()
    )
    options = first["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    sent = build(
        Target(first["metadata"]["namespace"], job, int(n)),
        JobSpec(
            name=job,
            command=tuple(options["command"]),
            nodes=1 + int((first["spec"]["pytorchReplicaSpecs"].get("Worker") or {}).get("replicas", 0)),
            kubeflow=KubeflowOptions(
                image=options["image"],
                resources=Resources(
                    cpu=options["resources"]["requests"]["cpu"],
                    memory=options["resources"]["requests"]["memory"],
                    gpu=int(options["resources"].get("limits", {}).get("nvidia.com/gpu", 0)),
                ),
                no_capacity_after_seconds=int(
                    first["metadata"]["annotations"]["dispatch.dev/no-capacity-after-seconds"]
                ),
            ),
        ),
        Plan(job=f"{first['metadata']['namespace']}/{job}", rules=rules),
    )  # no owner: the recorder has no DispatchJob to own it
    assert _subset(without_identity(sent), first) == []


def test_the_real_webhook_refuses_what_the_builder_leaves_to_it() -> None:
    """The builder does not re-implement the validating webhook: a name that is not a DNS-1035 label
    is refused by the real one (403, 'denied the request'), which create() treats as final."""
    data = json.loads((DATA / "webhook-refused.json").read_text())
    answer = data["create"]
    assert answer["returncode"] != 0
    assert "Error from server (Forbidden)" in answer["stderr"]  # kubectl's rendering of a 403
    message = answer["stderr"].split(": ", 2)[-1]
    assert "metadata.name" in message
    assert refused_for_good(KubeError("POST", "/apis/kubeflow.org/v1/pytorchjobs", 403, "Forbidden", message))
    # An RBAC 403 is not the spec's fault: it is retried, not turned into a job failure.
    assert not refused_for_good(
        KubeError("POST", "/x", 403, "Forbidden", 'pytorchjobs is forbidden: User "u"')
    )

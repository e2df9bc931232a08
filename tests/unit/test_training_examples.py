"""examples/training: the reference training job's four manifests are DispatchJobs the plan
accepts, with the preemption rule resubmitting, and they run the same script the same way; only
the rendezvous (the node's rank and the master) comes from each kind's own environment."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatch._cli.main import main

EXAMPLES = sorted((Path(__file__).parents[2] / "examples" / "training").glob("*.yaml"))
TORCHRUN = ["python3", "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1"]


def dispatch_job(path: Path) -> dict[str, Any]:
    (job,) = [d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] == "DispatchJob"]
    return dict(job)


def test_there_is_one_for_each_kubernetes_backend() -> None:
    assert sorted(dispatch_job(p)["spec"]["backend"] for p in EXAMPLES) == [
        "job",
        "jobset",
        "kubeflow",
        "trainjob",
    ]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_the_plan_accepts_it(path: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    code = main(["plan", "-f", str(path), "-o", "json"], stdout=out, stderr=err)
    assert (code, err.getvalue()) == (0, "")
    (rule,) = json.loads(out.getvalue())["rules"]
    assert (rule["on"], rule["action"], rule["enforcer"]) == (
        ["preempted", "node-lost"],
        "resubmit",
        "supervisor",
    )


def test_they_run_the_same_script_with_the_same_flags() -> None:
    commands = {p.name: dispatch_job(p)["spec"]["command"] for p in EXAMPLES}
    for name, command in commands.items():
        assert command[: len(TORCHRUN)] == TORCHRUN, name
        rendezvous = command[len(TORCHRUN) : command.index("/opt/train/train.py")]
        assert [a.split("=")[0] for a in rendezvous] == ["--node-rank", "--master-addr", "--master-port"], (
            name
        )
    scripts = {tuple(c[c.index("/opt/train/train.py") :]) for c in commands.values()}
    assert len(scripts) == 1, scripts

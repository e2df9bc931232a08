"""The operator driving the Slurm bridge, on each real Slurm (22.05, 24.11, 26.05): a DispatchJob with
``spec.backend: slurm`` applied with kubectl runs on the real Slurm lab (tests/support/slurmlab.py)
through a real preemption (partition ``lowcxl``, PreemptMode CANCEL, preempted by a whole-node job
in ``high``) to success, with the record in the DispatchJob's status exactly as on Kubeflow, and
``kubectl wait`` on its ``Succeeded`` condition. The operator reads the Slurm JWT from a file (as the
chart mounts it from a Secret) given in ``--slurm-config``; the token appears neither in the
operator's log, nor in the status, nor in any Event.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatch._backends.slurm._adapter import open_adapter
from dispatch._dispatchjob import record_from
from tests.integration.conftest import OperatorProcess, apply, await_for, condition, get_job, history
from tests.support.builders import SEED_HISTORY, manifest
from tests.support.kube import KubeCluster
from tests.support.slurmlab import SlurmLab

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

NAME = "seed-slurm"


def slurm_job(name: str) -> str:
    """The seed's job as a user writes it for Slurm: one node of the CANCEL-mode partition."""
    return manifest(
        name,
        backend="slurm",
        command=["bash", "-c", "sleep 6"],
        nodes=1,
        backend_options={"partition": "lowcxl", "cpusPerTask": 2},
        recovery={"rules": [{"on": ["preempted"], "budget": 2}]},
    )


def slurm_config(slurm: SlurmLab, directory: Path) -> Path:
    """The adapter's configuration with the token in a file of its own (a mounted Secret)."""
    token = directory / "slurm-token" / "token"
    token.parent.mkdir()
    token.write_text(slurm.token + "\n")
    token.chmod(0o600)
    config = {k: v for k, v in slurm.backend_config(poll_interval=1.0).items() if k != "token"}
    config["token_file"] = str(token)
    # No standard_output: the adapter's default must work for the operator's job ids ("ns/name").
    path = directory / "slurm.yaml"
    path.write_text(yaml.safe_dump(config))
    assert slurm.token not in path.read_text()
    return path


async def test_seed_scenario_on_slurm_through_the_operator(
    crds: KubeCluster,
    namespace: str,
    operator: Callable[..., OperatorProcess],
    slurm: SlurmLab,
    tmp_path: Path,
) -> None:
    op = operator(f"--slurm-config={slurm_config(slurm, tmp_path)}", "--log-level=DEBUG")
    await asyncio.to_thread(apply, crds, namespace, slurm_job(NAME))

    def running() -> str | None:
        status = get_job(crds, namespace, NAME).get("status") or {}
        for s in status.get("submissions") or ():
            if s["n"] == 1 and s.get("canonical"):
                job_id = str(s["canonical"])
                return job_id if slurm.job_state(job_id).get("JobState") == "RUNNING" else None
        return None

    first = await await_for("submission 1 running on Slurm", running)
    body = await asyncio.to_thread(get_job, crds, namespace, NAME)
    assert body["status"]["plan"]["rules"][0]["enforcer"] == "supervisor"
    blocker = await asyncio.to_thread(slurm.submit_blocker, "high", 2, 3)  # preempts submission 1

    await asyncio.to_thread(
        crds.kubectl,
        "wait",
        "-n",
        namespace,
        f"dispatchjob/{NAME}",
        "--for=condition=Succeeded",
        "--timeout=180s",
        timeout=200,
    )
    await await_for("settled", lambda: (get_job(crds, namespace, NAME).get("status") or {}).get("settled"))
    body = await asyncio.to_thread(get_job, crds, namespace, NAME)
    status = body["status"]
    assert history(body) == SEED_HISTORY
    assert status["state"] == "succeeded"
    assert [s["n"] for s in status["submissions"]] == [1, 2]
    assert status["submissions"][0]["cause"]["kind"] == "preempted"
    assert status["submissions"][1]["cause"]["kind"] == "none"
    assert status["plan"]["rules"][0]["firings"] == 1
    assert all(h["actor"] == {"kind": "supervisor", "id": "supervisor"} for h in status["history"])
    assert condition(body, "Ready")["status"] == "True"  # type: ignore[index]
    assert condition(body, "Reconciling") is None
    assert condition(body, "Stalled") is None
    canonicals = [str(s["canonical"]) for s in status["submissions"]]
    assert canonicals[0] == first
    assert len(set(canonicals)) == 2
    assert blocker not in {int(c) for c in canonicals}
    assert (slurm.jobs_dir / f"dispatch-{canonicals[1]}.out").exists()  # relative to its working dir
    for job_id, expected in zip(canonicals, ("PREEMPTED", "COMPLETED"), strict=True):
        state = slurm.job_state(job_id).get("JobState")
        assert state in (expected, None), (job_id, state)  # None: Slurm forgot it (MinJobAge)

    # The token was read from its file and is nowhere: log, status, events.
    events = json.loads(crds.kubectl("get", "events", "-n", namespace, "-o", "json"))["items"]
    reasons = {
        e["reason"]
        for e in events
        if (e.get("regarding") or e.get("involvedObject") or {}).get("name") == NAME
    }
    assert {"Recovering", "Succeeded"} <= reasons, reasons
    everything: dict[str, Any] = {
        "log": op.log(),
        "object": json.dumps(body),
        "events": json.dumps(events),
    }
    assert "authorizing submission 2" in everything["log"]
    for where, text in everything.items():
        assert slurm.token not in text, f"the Slurm token appears in the {where}"
        assert slurm.token.split(".")[-1] not in text, f"the Slurm token's signature appears in the {where}"


async def test_a_job_held_after_the_dispatchjob_settled_is_cancelled_at_the_next_start(
    crds: KubeCluster,
    namespace: str,
    operator: Callable[..., OperatorProcess],
    slurm: SlurmLab,
    tmp_path: Path,
) -> None:
    """Invariant 5's exception on Slurm: a supervisor's create landed after the job settled and it
    died before it could end what it made, while no operator ran. The next operator's first turn
    of the settled job lists its Slurm jobs (from the poller's one shared listing) and cancels the
    held one, writing nothing to the settled record."""
    name = "late-slurm"
    op = operator(f"--slurm-config={slurm_config(slurm, tmp_path)}")
    manifest = yaml.safe_load(slurm_job(name))
    manifest["spec"]["command"] = ["true"]
    await asyncio.to_thread(apply, crds, namespace, yaml.safe_dump(manifest))
    await await_for(
        "settled", lambda: (get_job(crds, namespace, name).get("status") or {}).get("settled"), within=120
    )
    op.stop()
    body = await asyncio.to_thread(get_job, crds, namespace, name)
    record = record_from(body)
    creator = open_adapter(slurm.backend_config())  # the supervisor that died after this create
    try:
        late = await creator.create(record.job, 2, record.spec, record.plan)
    finally:
        await creator.aclose()
    assert slurm.job_state(late).get("JobState") == "PENDING", slurm.job_state(late)  # held
    op.start()
    await await_for(
        f"Slurm job {late} cancelled",
        lambda: slurm.job_state(late).get("JobState") in ("CANCELLED", None),
        within=60,
    )
    await await_for("the operator's line for that end", lambda: f"ending object {late}" in op.log())
    after = await asyncio.to_thread(get_job, crds, namespace, name)
    assert after["status"] == body["status"], "the settled record was written"

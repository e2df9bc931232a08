"""The operator with Slurm identities by namespace, on each real Slurm: the test's namespace runs as
the Slurm user ``daemon`` with its own token (the operator's own token, the lab's ``dispatch``, only
lists jobs); a DispatchJob outside the identity's limits is refused at apply by the operator's
webhook naming the field, and one within them runs on Slurm owned by ``daemon``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.integration.conftest import OperatorProcess, await_for, free_port, get_job
from tests.support.builders import manifest
from tests.support.kube import KubeCluster, KubectlError
from tests.support.slurmlab import SlurmLab

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

TENANT_USER = "daemon"


def tenants_config(slurm: SlurmLab, namespace: str, directory: Path) -> Path:
    token = directory / "tenant-token"
    token.write_text(slurm.mint_token(TENANT_USER) + "\n")
    token.chmod(0o600)
    config = slurm.backend_config(poll_interval=1.0)
    config["tenants"] = [
        {
            "name": "team",
            "namespaces": [namespace],
            "user_name": TENANT_USER,
            "token_file": str(token),
            "partitions": ["low"],
            "max_time_limit_seconds": 600,
            "max_nodes": 1,
            "working_directories": [str(slurm.inner_jobs_dir)],
        }
    ]
    path = directory / "slurm.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def job(name: str, **slurm: object) -> str:
    options = {"partition": "low", **slurm}
    return manifest(
        name, backend="slurm", command=["sleep", "8"], nodes=1, backend_options=options, timeLimitSeconds=300
    )


async def test_a_namespace_runs_as_its_identity_and_is_refused_outside_it(
    crds: KubeCluster,
    namespace: str,
    operator: Callable[..., OperatorProcess],
    slurm: SlurmLab,
    tmp_path: Path,
) -> None:
    managed = f"tenants-{free_port()}.dispatch.dev"
    operator(
        f"--slurm-config={tenants_config(slurm, namespace, tmp_path)}",
        f"--webhook-port={free_port()}",
        env={"DISPATCH_WEBHOOK_HOST": "127.0.0.1", "DISPATCH_WEBHOOK_MANAGED": managed},
    )
    try:
        big = job("big", partition="high")

        def refusal() -> str | None:
            try:
                crds.kubectl(
                    "apply",
                    "-n",
                    namespace,
                    "--dry-run=server",
                    "-f",
                    "-",
                    input=big,
                )
            except KubectlError as error:
                return error.stderr if "denied the request" in error.stderr else None
            return None

        message = await await_for("the webhook refusing", refusal)
        assert "spec.slurm.partition: 'high' is not a partition Slurm identity 'team'" in message
        crds.kubectl("apply", "-n", namespace, "-f", "-", input=job("runs"))

        def running() -> str | None:
            status = get_job(crds, namespace, "runs").get("status") or {}
            for s in status.get("submissions") or ():
                if s.get("canonical"):
                    state = slurm.job_state(str(s["canonical"]))
                    return state.get("UserId") if state.get("JobState") == "RUNNING" else None
            return None

        owner = await await_for("the job running on Slurm", running)
        assert owner.split("(")[0] == TENANT_USER
        await asyncio.to_thread(
            crds.kubectl,
            "wait",
            "-n",
            namespace,
            "dispatchjob/runs",
            "--for=condition=Succeeded",
            "--timeout=120s",
            timeout=140,
        )
    finally:
        for kind in ("validatingwebhookconfiguration", "mutatingwebhookconfiguration"):
            crds.kubectl("delete", kind, managed, "--ignore-not-found", check=False)

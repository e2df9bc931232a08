"""Slurm identities by namespace on the real Slurms: two namespaces, two Slurm users.

Each job runs as its namespace's user (Slurm's own record of the job says so), a job outside its
identity's limits is refused before anything reaches Slurm, naming the field, and a job another
Slurm user planted with a copied tag is never adopted.
The lab's second user is ``daemon`` (every Debian system and chroot has it); the lab runs no
accounting database, so ``scontrol show job``'s ``UserId`` is Slurm's record of the owner.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from dispatch import JobSpec, SlurmOptions
from dispatch._backends.slurm._adapter import open_adapter
from dispatch._errors import OutsideLimits
from dispatch._model import Phase
from dispatch._plan import make_plan
from tests.support.slurmlab import JOB_USER, SlurmLab

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

OTHER_USER = "daemon"


def spec(limit: int = 300, **slurm: object) -> JobSpec:
    options = SlurmOptions.model_validate(slurm)
    return JobSpec(name="train", command=("sleep", "30"), slurm=options, time_limit_seconds=limit)


async def test_each_namespace_runs_as_its_own_slurm_user(slurm: SlurmLab) -> None:
    jobs = str(slurm.inner_jobs_dir)
    tenants = [
        {
            "name": "team-a",
            "namespaces": ["team-a"],
            "user_name": JOB_USER,
            "token": slurm.mint_token(JOB_USER),
            "partitions": ["low"],
            "max_time_limit_seconds": 600,
            "max_nodes": 1,
            "working_directories": [jobs],
        },
        {
            "name": "team-b",
            "namespaces": ["team-b"],
            "user_name": OTHER_USER,
            "token": slurm.mint_token(OTHER_USER),
            "working_directories": [jobs],
        },
    ]
    backend = open_adapter(slurm.backend_config(poll_interval=0.5, tenants=tenants))
    plan = make_plan("team-a/train", spec(), backend.capabilities, supervised=True)
    try:
        d = await backend.dialect()
        # team-b's user plants a job carrying team-a's tag: listed by Slurm, never team-a's.
        planted_req = backend.submit_request("team-a/train", 1, spec())
        team_b = backend.clients.by_tenant["team-b"]
        resp = await team_b.request(
            "POST", d.submit_path(), body=d.submit_body(planted_req), what="plant", accept=(2042,)
        )
        planted = d.parse_submit(resp.body)
        assert planted is not None
        with pytest.raises(OutsideLimits, match=r"^spec\.slurm\.partition: 'high' is not a partition"):
            backend.admit("team-a/train", spec(partition="high"))
        with pytest.raises(OutsideLimits, match=r"^spec\.timeLimitSeconds: 660 is over the 600"):
            backend.admit("team-a/train", spec(limit=660))
        before = set(slurm.job_ids())
        refused = await backend.create("team-a/big", 1, spec(partition="high"), plan)
        assert refused.startswith("refused-")
        assert set(slurm.job_ids()) == before
        a = await backend.create("team-a/train", 1, spec(), plan)
        b = await backend.create("team-b/train", 1, spec(partition="high"), plan)
        await backend.release(a)
        await backend.release(b)
        deadline = time.monotonic() + 60
        while True:
            views = [*await backend.list("team-a/train"), *await backend.list("team-b/train")]
            if {v.id: v.phase for v in views} == {a: Phase.RUNNING, b: Phase.RUNNING}:
                break
            assert time.monotonic() < deadline, views
            await asyncio.sleep(0.2)
        assert [v.id for v in await backend.list("team-a/train")] == [a]
        owners = {i: slurm.job_state(i)["UserId"].split("(")[0] for i in (a, b, planted)}
        assert owners == {a: JOB_USER, b: OTHER_USER, planted: OTHER_USER}
        assert slurm.job_state(b)["Partition"] == "high"
        await backend.end(a)
        await backend.end(b)
        slurm.wait_for(
            lambda: all(slurm.job_state(i).get("JobState") in (None, "CANCELLED") for i in (a, b)),
            30,
            "both cancelled",
        )
    finally:
        await backend.aclose()

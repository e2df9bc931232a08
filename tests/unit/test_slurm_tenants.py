"""Slurm identities by namespace: a job runs only as its namespace's identity, within its limits;
what is outside is refused at apply naming the field, and one listing serves every identity."""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from dispatch import JobSpec, RecoveryPolicy, Rule, SlurmChange, SlurmOptions
from dispatch._backends.slurm import SlurmConfig
from dispatch._backends.slurm._adapter import SlurmBackend
from dispatch._backends.slurm._tenants import tenant_for
from dispatch._controller.webhook import Admission, Refused, check
from dispatch._errors import OutsideLimits
from dispatch._model import CauseKind, Change, TimeLimitChange
from tests.support.builders import dispatch_job
from tests.support.fake_slurm import FakeSlurm

TEAM_A: dict[str, Any] = {
    "name": "team-a",
    "namespaces": ["team-a"],
    "user_name": "alice",
    "token": "token-a",
    "account": "acct-a",
    "qos": "normal",
    "partitions": ["low", "lowcxl"],
    "max_time_limit_seconds": 3600,
    "max_nodes": 2,
    "working_directories": ["/scratch/team-a"],
}
TEAM_B: dict[str, Any] = {"name": "team-b", "namespaces": ["team-b"], "user_name": "bob", "token": "token-b"}


def config(**extra: Any) -> SlurmConfig:
    return SlurmConfig.model_validate(
        {
            "url": "http://slurm.test",
            "user_name": "dispatch",
            "token": "token-operator",
            "api_version": "v0.0.38",
            "tenants": [TEAM_A, TEAM_B],
            **extra,
        }
    )


def spec(
    nodes: int = 1, rules: tuple[Rule, ...] = (), time_limit_seconds: int | None = 1800, **slurm: Any
) -> JobSpec:
    return JobSpec(
        name="train",
        command=("true",),
        nodes=nodes,
        slurm=SlurmOptions(**slurm),
        recovery=RecoveryPolicy(rules=rules),
        time_limit_seconds=time_limit_seconds,
    )


@pytest.mark.parametrize(
    ("job", "refused", "message"),
    [
        (spec(partition="high"), "spec.slurm.partition", "'high' is not a partition"),
        (
            spec(
                rules=(
                    Rule(
                        on=(CauseKind.UNKNOWN,), budget=1, change=Change(slurm=SlurmChange(partition="high"))
                    ),
                )
            ),
            r"spec.recovery.rules\[0\].change.slurm.partition",
            "'high' is not a partition",
        ),
        (spec(time_limit_seconds=3601), "spec.timeLimitSeconds", "3601 is over the 3600"),
        (spec(time_limit_seconds=None), "spec.timeLimitSeconds", "required by"),
        (
            spec(
                rules=(
                    Rule(
                        on=(CauseKind.TIME_LIMIT,),
                        budget=1,
                        change=Change(time_limit=TimeLimitChange(factor=2, max_seconds=7200)),
                    ),
                )
            ),
            r"spec.recovery.rules\[0\].change.timeLimit.maxSeconds",
            "7200 is over the 3600",
        ),
        (spec(nodes=3), "spec.nodes", "3 is over the 2"),
        (spec(working_directory="/scratch/team-b"), "spec.slurm.workingDirectory", "not under"),
        (spec(working_directory="/scratch/team-a/../team-b"), "spec.slurm.workingDirectory", "not under"),
        (spec(working_directory="/scratch/team-ab"), "spec.slurm.workingDirectory", "not under"),
    ],
)
def test_a_job_outside_its_identitys_limits_is_refused_naming_the_field(
    job: JobSpec, refused: str, message: str
) -> None:
    with pytest.raises(OutsideLimits, match=rf"^{refused}: .*{message}"):
        tenant_for(config(), "team-a/train", job)


def test_a_job_within_its_limits_runs_as_its_namespaces_identity() -> None:
    cfg = config()
    job = spec(partition="lowcxl", nodes=2, working_directory="/scratch/team-a/run")
    assert tenant_for(cfg, "team-a/train", job) == cfg.tenants[0]
    assert tenant_for(cfg, "team-b/train", spec(partition="high", nodes=64)) == cfg.tenants[1]
    with pytest.raises(
        OutsideLimits, match=r"^spec\.backend: slurm has no Slurm identity for namespace 'team-c'"
    ):
        tenant_for(cfg, "team-c/train", job)
    single = SlurmConfig(url="http://slurm.test", token="t")
    assert tenant_for(single, "team-c/train", spec(partition="high", nodes=64)) is None


def test_a_namespace_has_one_identity_and_tenants_need_a_token_and_a_url() -> None:
    with pytest.raises(ValidationError, match="namespace 'team-a' is in tenants 'team-a' and 'again'"):
        config(tenants=[TEAM_A, {**TEAM_B, "name": "again", "namespaces": ["team-a"]}])
    with pytest.raises(ValidationError, match="exactly one of 'token' and 'token_file'"):
        config(tenants=[{**TEAM_B, "token": None}])
    with pytest.raises(ValidationError, match="'tenants' need the operator's own 'token'"):
        config(token=None)
    with pytest.raises(ValidationError, match="'tenants' need 'url'"):
        SlurmConfig(socket="/run/slurmrestd.sock", tenants=[TEAM_B])


def test_the_webhook_refuses_a_job_outside_its_namespaces_identity_at_apply() -> None:
    backend = SlurmBackend(config())
    admission = Admission(limits=lambda name: backend if name == "slurm" else None)
    slurm = {"partition": "high"}
    job = dispatch_job(
        "train", backend="slurm", namespace="team-a", backend_options=slurm, timeLimitSeconds=1800
    )
    with pytest.raises(Refused, match=r"^spec\.slurm\.partition: 'high' is not a partition"):
        check(job, None, "CREATE", admission)
    other = dispatch_job("train", backend="slurm", namespace="team-c", backend_options=slurm)
    with pytest.raises(Refused, match=r"^spec\.backend: slurm has no Slurm identity for namespace 'team-c'"):
        check(other, None, "CREATE", admission)
    check(
        dispatch_job("train", backend="slurm", namespace="team-b", backend_options=slurm),
        None,
        "CREATE",
        admission,
    )


class Recording(FakeSlurm):
    """The fake slurmrestd, also taking submits and cancels, recording who sent each."""

    def __init__(self) -> None:
        super().__init__(0)
        self.sent: list[tuple[str, str, str | None, dict[str, Any]]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        user = request.headers.get("X-SLURM-USER-NAME")
        body = json.loads(request.content) if request.content else {}
        if request.method == "POST" and path.endswith("/job/submit"):
            self.sent.append(("submit", user or "", request.headers.get("X-SLURM-USER-TOKEN"), body))
            jid = 500 + len(self.jobs)
            job = body["job"]
            self.jobs[jid] = {
                **self._record(jid, "x", "RUNNING"),
                "comment": job["comment"],
                "user_name": user,
            }
            return httpx.Response(200, json={"job_id": jid, "errors": []})
        if request.method == "DELETE" and re.search(r"/job/\d+$", path):
            self.sent.append(("cancel", user or "", request.headers.get("X-SLURM-USER-TOKEN"), body))
            return httpx.Response(200, json={"errors": []})
        if request.method == "GET" and path.endswith("/jobs"):
            self.sent.append(("list", user or "", request.headers.get("X-SLURM-USER-TOKEN"), body))
        return super().__call__(request)


async def test_each_job_runs_as_its_identity_and_one_listing_serves_them_all() -> None:
    fake = Recording()
    backend = SlurmBackend(config(poll_interval=0.05), transport=httpx.MockTransport(fake))
    plan: Any = None
    try:
        a = await backend.create("team-a/train", 1, spec(), plan)
        b = await backend.create("team-b/train", 1, spec(partition="high"), plan)
        refused = await backend.create("team-c/train", 1, spec(), plan)
        assert [v.id for v in await backend.list("team-a/train")] == [a]
        assert [v.id for v in await backend.list("team-b/train")] == [b]
        (view,) = await backend.list("team-c/train")
        assert view.id == refused
        assert view.cause is not None
        assert "no Slurm identity for namespace 'team-c'" in view.cause.detail
        await backend.end(a)
        await backend.end(b)
    finally:
        await backend.aclose()
    submits = [(u, t, s["job"]) for kind, u, t, s in fake.sent if kind == "submit"]
    assert [(u, t) for u, t, _ in submits] == [("alice", "token-a"), ("bob", "token-b")]
    first, second = (job for _, _, job in submits)
    assert (first["account"], first["qos"], first["partition"]) == ("acct-a", "normal", "low")
    assert first["current_working_directory"] == "/scratch/team-a"
    assert "account" not in second
    assert second["partition"] == "high"
    assert [(u, t) for kind, u, t, _ in fake.sent if kind == "cancel"] == [
        ("alice", "token-a"),
        ("bob", "token-b"),
    ]
    assert {(u, t) for kind, u, t, _ in fake.sent if kind == "list"} == {("dispatch", "token-operator")}


async def test_a_job_of_another_identity_with_a_copied_tag_is_never_adopted() -> None:
    fake = Recording()
    backend = SlurmBackend(config(poll_interval=0.05), transport=httpx.MockTransport(fake))
    try:
        planted = fake._record(900, "team-a/train", "RUNNING")
        fake.jobs[900] = {**planted, "user_name": "bob"}  # team-b's user copied team-a's tag
        fake.jobs[901] = {**fake._record(901, "team-c/train", "RUNNING"), "user_name": "dispatch"}
        assert await backend.list("team-a/train") == []
        assert await backend.list("team-c/train") == []  # a namespace without an identity owns nothing
        fake.jobs[902] = {**fake._record(902, "team-a/train", "RUNNING"), "user_name": "alice"}
        fake.last_update += 100
        await asyncio.sleep(0.2)
        assert [v.id for v in await backend.list("team-a/train")] == ["902"]
    finally:
        await backend.aclose()


async def test_a_rotated_token_file_is_used_without_a_restart(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("SLURM_JWT=old-token\n")
    tenant = {**TEAM_B, "token": None, "token_file": str(token)}
    fake = Recording()
    backend = SlurmBackend(config(tenants=[tenant]), transport=httpx.MockTransport(fake))
    try:
        await backend.create("team-b/train", 1, spec(), None)  # type: ignore[arg-type]
        token.write_text("new-token\n")
        os.utime(token, (time.time() + 5, time.time() + 5))  # a new mtime even on a coarse clock
        await backend.create("team-b/train", 2, spec(), None)  # type: ignore[arg-type]
    finally:
        await backend.aclose()
    assert [t for kind, _, t, _ in fake.sent if kind == "submit"] == ["old-token", "new-token"]


@pytest.mark.parametrize("identities", [1, 8])
async def test_one_listing_per_cycle_whatever_the_number_of_identities(identities: int) -> None:
    tenants = [
        {"name": f"t{i}", "namespaces": [f"ns{i}"], "user_name": f"u{i}", "token": f"tok{i}"}
        for i in range(identities)
    ]
    fake = Recording()
    backend = SlurmBackend(config(tenants=tenants, poll_interval=0.05), transport=httpx.MockTransport(fake))
    try:
        for i in range(identities):
            await backend.create(f"ns{i}/train", 1, spec(), None)  # type: ignore[arg-type]
        cycles = 0
        while cycles < 5:
            for i in range(identities):
                await backend.list(f"ns{i}/train")
            cycles = backend.rest.requests  # the dialect is given: no probe, every request a listing
            await asyncio.sleep(0.05)
        lists = [u for kind, u, _, _ in fake.sent if kind == "list"]
        assert set(lists) == {"dispatch"}
        assert len(lists) == backend.rest.requests
        assert sum(c.requests for c in backend.clients.by_tenant.values()) == identities  # the submits
    finally:
        await backend.aclose()

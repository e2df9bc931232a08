"""The Slurm dialects, the classifier and the REST error handling, against recorded responses.

v0.0.38 responses are as the lab showed them (shared/notes/slurm-notes.md, trimmed); v0.0.40 and
v0.0.41 responses are written from SchedMD's published OpenAPI descriptions of those versions.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from dispatch._errors import PlanError, TransientBackendError
from dispatch._model import (
    Action,
    Capabilities,
    CauseKind,
    Enforcer,
    JobSpec,
    Phase,
    Plan,
    PlannedRule,
    RecoveryPolicy,
    Rule,
    SlurmOptions,
)
from dispatch._plan import make_plan
from dispatch._slurm import CAPABILITIES, SlurmBackend, SlurmConfig, open_adapter
from dispatch._slurm._classify import classify
from dispatch._slurm._dialects import V0038, V0040, V0041, Dialect, SlurmJob, dialect_for
from dispatch._slurm._poller import parse_tag
from dispatch._slurm._rest import SlurmApiError

DATA = Path(__file__).parent / "data" / "slurm"
TOKEN = "eyJhbGciOiJIUzI1NiJ9.c2VjcmV0LXRva2Vu.s3cr3t-signature"


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / name).read_text())
    return data


Handler = Callable[[httpx.Request], httpx.Response]


def backend(handler: Handler, version: str | None = "v0.0.38", **cfg: Any) -> SlurmBackend:
    config = SlurmConfig.model_validate(
        {"url": "http://slurm.test", "user_name": "dispatch", "token": TOKEN, "api_version": version, **cfg}
    )
    return SlurmBackend(config, transport=httpx.MockTransport(handler))


def reply(status: int, body: object) -> httpx.Response:
    return httpx.Response(status, json=body)


# ---------------------------------------------------------------------------------------- parsing


def jobs_of(version: str) -> dict[int, SlurmJob]:
    d = dialect_for(version)
    return {j.job_id: j for j in d.parse_jobs(load(f"{version}-jobs.json"))}


def test_v0038_parsing() -> None:
    jobs = jobs_of("v0.0.38")
    assert jobs[2].state == "FAILED"
    assert jobs[2].exit_status == 3
    assert jobs[2].signal is None
    assert jobs[4].signal == 9
    assert jobs[4].exit_status is None
    assert jobs[5].signal == 53  # 4021 & 0x7f
    assert jobs[11].state == ""
    assert jobs[11].flags == {"COMPLETING"}
    assert jobs[24].hold
    assert not jobs[21].hold
    assert jobs[14].restart_cnt == 1
    assert parse_tag(jobs[1].comment) == ("table", 1)


@pytest.mark.parametrize("version", ["v0.0.40", "v0.0.41"])
def test_v004x_parsing(version: str) -> None:
    jobs = jobs_of(version)
    assert jobs[2].state == "FAILED"
    assert jobs[2].exit_status == 3
    assert jobs[4].signal == 9
    assert jobs[4].exit_status is None
    assert jobs[6].state == "PENDING"
    assert jobs[6].flags == {"REQUEUED", "LAUNCH_FAILED"}
    assert jobs[6].hold
    assert jobs[11].state == "RUNNING"
    assert "COMPLETING" in jobs[11].flags
    assert jobs[13].restart_cnt == 1
    assert "REQUEUED" in jobs[13].flags


# The observed table of the notes (§6), v0.0.38: job id -> (phase, cause, cancelled, restarts).
V0038_TABLE: dict[int, tuple[Phase, CauseKind | None, bool, int]] = {
    1: (Phase.ENDED, CauseKind.NONE, False, 0),  # COMPLETED/None/0
    2: (Phase.ENDED, CauseKind.NON_ZERO_EXIT, False, 0),  # FAILED/NonZeroExitCode/768
    3: (Phase.ENDED, CauseKind.NON_ZERO_EXIT, False, 0),  # no shebang: exit 8
    4: (Phase.ENDED, CauseKind.UNKNOWN, False, 0),  # kill -9: JobLaunchFailure/9, cannot be told from OOM
    5: (Phase.ENDED, CauseKind.LAUNCH_FAILED, False, 0),  # JobLaunchFailure/4021 (signal 53)
    6: (Phase.ENDED, CauseKind.LAUNCH_FAILED, False, 1),  # prolog failed, requeued held
    7: (Phase.ENDED, CauseKind.UNKNOWN, True, 0),  # prolog failed with no_requeue: looks like a cancel
    8: (Phase.ENDED, CauseKind.OUT_OF_MEMORY, False, 0),  # cgroup v1: OUT_OF_MEMORY/253
    9: (Phase.ENDED, CauseKind.TIME_LIMIT, False, 0),  # TIMEOUT/TimeLimit/15
    10: (Phase.RUNNING, None, False, 0),
    11: (Phase.RUNNING, None, False, 0),  # COMPLETING: still holds the node
    12: (Phase.ENDED, CauseKind.PREEMPTED, False, 0),  # PREEMPTED/None/15 (CANCEL, or no_requeue)
    13: (Phase.RUNNING, None, False, 1),  # REQUEUE preemption, completing, restart_cnt already +1
    14: (Phase.QUEUED, None, False, 1),  # requeued: PENDING/BeginTime, restart_cnt 1
    15: (Phase.ENDED, CauseKind.NODE_LOST, False, 0),  # NODE_FAIL/NodeDown/15
    16: (Phase.ENDED, CauseKind.UNKNOWN, True, 0),  # cancelled while running
    17: (Phase.ENDED, CauseKind.UNKNOWN, True, 0),  # cancelled while held
    18: (Phase.ENDED, CauseKind.NO_CAPACITY, False, 0),  # PENDING/PartitionConfig: never fits
    19: (Phase.ENDED, CauseKind.NO_CAPACITY, False, 0),  # PENDING/PartitionNodeLimit
    20: (Phase.ENDED, CauseKind.NO_CAPACITY, False, 0),  # FAILED/BadConstraints
    21: (Phase.QUEUED, None, False, 0),  # Resources
    22: (Phase.QUEUED, None, False, 0),  # Priority
    23: (Phase.QUEUED, None, False, 0),  # node drained: waits
    24: (Phase.HELD, None, False, 0),  # JobHeldUser, priority 0
    25: (Phase.QUEUED, None, False, 1),  # node-lost requeue, before BeginTime shows
}

V004X_TABLE: dict[int, tuple[Phase, CauseKind | None, bool, int]] = {
    1: (Phase.ENDED, CauseKind.NONE, False, 0),
    2: (Phase.ENDED, CauseKind.NON_ZERO_EXIT, False, 0),
    4: (Phase.ENDED, CauseKind.UNKNOWN, False, 0),
    5: (Phase.ENDED, CauseKind.LAUNCH_FAILED, False, 0),
    6: (Phase.ENDED, CauseKind.LAUNCH_FAILED, False, 1),
    7: (Phase.ENDED, CauseKind.LAUNCH_FAILED, False, 0),
    8: (Phase.ENDED, CauseKind.OUT_OF_MEMORY, False, 0),
    9: (Phase.ENDED, CauseKind.TIME_LIMIT, False, 0),
    10: (Phase.RUNNING, None, False, 0),
    11: (Phase.RUNNING, None, False, 0),
    12: (Phase.ENDED, CauseKind.PREEMPTED, False, 0),
    13: (Phase.QUEUED, None, False, 1),
    15: (Phase.ENDED, CauseKind.NODE_LOST, False, 0),
    16: (Phase.ENDED, CauseKind.UNKNOWN, True, 0),
    18: (Phase.ENDED, CauseKind.NO_CAPACITY, False, 0),
    20: (Phase.ENDED, CauseKind.NO_CAPACITY, False, 0),
    21: (Phase.QUEUED, None, False, 0),
    24: (Phase.HELD, None, False, 0),
    26: (Phase.RUNNING, None, False, 0),  # COMPLETED but still COMPLETING
    27: (Phase.ENDED, CauseKind.REQUEUED, False, 6),  # held after too many requeues
    28: (Phase.ENDED, CauseKind.LAUNCH_FAILED, False, 0),
    29: (Phase.ENDED, CauseKind.TIME_LIMIT, False, 0),
}

STUCK = {6, 18, 19, 27}


@pytest.mark.parametrize(
    ("version", "job_id"),
    [("v0.0.38", j) for j in V0038_TABLE] + [(v, j) for v in ("v0.0.40", "v0.0.41") for j in V004X_TABLE],
)
def test_classification_table(version: str, job_id: int) -> None:
    table = V0038_TABLE if version == "v0.0.38" else V004X_TABLE
    phase, kind, cancelled, restarts = table[job_id]
    c = classify(jobs_of(version)[job_id])
    assert c.phase is phase
    assert (c.cause.kind if c.cause else None) is kind
    assert (c.cancelled, c.restarts) == (cancelled, restarts)
    assert c.stuck == (job_id in STUCK)
    if c.phase is Phase.ENDED:
        assert c.cause is not None
        assert c.cause.detail
    if kind is CauseKind.NON_ZERO_EXIT:
        assert c.cause is not None
        assert c.cause.exit_code in (3, 8)


def test_signal_kill_detail_names_what_cannot_be_told_apart() -> None:
    c = classify(jobs_of("v0.0.38")[4])
    assert c.cause is not None
    assert "SIGKILL" in c.cause.detail
    assert "out-of-memory" in c.cause.detail


def test_unknown_state_is_never_an_end() -> None:
    assert classify(SlurmJob(job_id=1, state="SOMETHING_NEW")).phase is Phase.RUNNING


# ---------------------------------------------------------------------------------------- requests

SPEC = JobSpec(
    name="train",
    command=("python", "train.py", "--lr", "0.1 x"),
    slurm=SlurmOptions(partition="low", time_limit_minutes=5, cpus_per_task=2, environment={"A": "1"}),
)


class Recorder:
    def __init__(self, responses: dict[tuple[str, str], tuple[int, object]]) -> None:
        self.responses = responses
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        status, body = self.responses.get((request.method, request.url.path), (404, "not found"))
        if isinstance(body, str):
            return httpx.Response(status, text=body)
        return reply(status, body)

    def body(self, i: int) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.requests[i].content)
        return data


@pytest.mark.parametrize("version", ["v0.0.38", "v0.0.40", "v0.0.41"])
async def test_submit_release_cancel_bodies(version: str) -> None:
    p = f"/slurm/{version}"
    rec = Recorder(
        {
            ("POST", f"{p}/job/submit"): (200, load(f"{version}-submit-held.json")),
            ("POST", f"{p}/job/3"): (
                200,
                load(f"{version}-update-ok.json" if version != "v0.0.38" else "v0.0.38-ok.json"),
            ),
            ("DELETE", f"{p}/job/3"): (
                200,
                load(f"{version}-cancel-ok.json" if version != "v0.0.38" else "v0.0.38-ok.json"),
            ),
        }
    )
    b = backend(rec, version)
    try:
        oid = await b.create("train", 2, SPEC, Plan(job="train"))
        assert oid == "3"
        await b.release(oid)
        await b.end(oid)
    finally:
        await b.aclose()
    submit = rec.body(0)
    job = submit["job"]
    assert job["name"] == "dispatch-train-2"
    assert job["comment"] == "dispatch:job=train;submission=2"
    assert job["hold"] is True
    assert job["partition"] == "low"
    script = job["script"] if version == "v0.0.41" else submit["script"]
    assert "script" not in submit if version == "v0.0.41" else "script" not in job
    assert script == "#!/bin/bash\nexec python train.py --lr '0.1 x'\n"
    if version == "v0.0.38":
        assert job["no_requeue"] is True
        assert "requeue" not in job
        assert job["environment"]["A"] == "1"
        assert job["environment"]["DISPATCH_SUBMISSION"] == "2"
        assert job["time_limit"] == 5
    else:
        assert job["requeue"] is False
        assert "A=1" in job["environment"]
        assert "DISPATCH_JOB=train" in job["environment"]
        assert job["time_limit"] == {"set": True, "infinite": False, "number": 5}
    assert rec.body(1) == {"hold": False}
    assert rec.requests[2].method == "DELETE"
    for r in rec.requests:
        assert r.headers["X-SLURM-USER-NAME"] == "dispatch"
        assert r.headers["X-SLURM-USER-TOKEN"] == TOKEN
        assert ("Authorization" in r.headers) == (version != "v0.0.38")


@pytest.mark.parametrize("version", ["v0.0.38", "v0.0.40", "v0.0.41"])
async def test_never_requeueable_even_with_a_rule_on_what_slurm_requeues(version: str) -> None:
    # A rule on [preempted node-lost] is the supervisor's: Slurm must not requeue in place (a
    # REQUEUE-mode preemption then ends the job PREEMPTED, and the supervisor resubmits it).
    rec = Recorder({("POST", f"/slurm/{version}/job/submit"): (200, load(f"{version}-submit-held.json"))})
    b = backend(rec, version)
    rules = RecoveryPolicy(rules=(Rule(on=(CauseKind.PREEMPTED, CauseKind.NODE_LOST), budget=5),))
    spec = SPEC.model_copy(update={"recovery": rules})
    plan = make_plan("train", spec, b.capabilities, supervised=True)
    assert plan.rules[0].enforcer is Enforcer.SUPERVISOR
    try:
        await b.create("train", 1, spec, plan)
    finally:
        await b.aclose()
    job = rec.body(0)["job"]
    if version == "v0.0.38":
        assert job["no_requeue"] is True  # "requeue": false is ignored by v0.0.38
        assert "requeue" not in job
    else:
        assert job["requeue"] is False
        assert "no_requeue" not in job


def test_capabilities_are_empty_so_every_restart_rule_is_refused() -> None:
    # Slurm's requeue limit does not bound preemption requeues, and a job's requeue flag cannot allow
    # node-failure requeues without preemption ones: Slurm enforces no rule exactly (docs/slurm.md).
    b = open_adapter({"url": "http://slurm.test"})
    assert b.capabilities == Capabilities()
    assert b.capabilities is CAPABILITIES

    def plan_for(*rules: Rule) -> Plan:
        spec = SPEC.model_copy(update={"recovery": RecoveryPolicy(rules=rules)})
        return make_plan("x", spec, b.capabilities, supervised=True)

    both = (CauseKind.PREEMPTED, CauseKind.NODE_LOST)
    assert plan_for(Rule(on=both, budget=5)).rules[0].enforcer is Enforcer.SUPERVISOR
    for on in (both, (CauseKind.PREEMPTED,), (CauseKind.NODE_LOST,)):
        for budget in (0, 1, 5, 100):
            with pytest.raises(PlanError) as caught:
                plan_for(Rule(on=on, action=Action.RESTART, budget=budget))
            assert caught.value.rule == 0
            assert str(caught.value) == (
                "rule 0 cannot be enforced: only a scheduler can restart in place, and this one does not "
                f"enforce restart on [{' '.join(on)}] with budget {budget} (it enforces nothing)"
            )


def test_the_requeue_limit_is_no_longer_configuration() -> None:
    with pytest.raises(ValidationError, match="max_batch_requeue"):
        open_adapter({"url": "http://slurm.test", "max_batch_requeue": 5})


async def test_multi_node_uses_srun_and_bulk_cancel_v0040() -> None:
    rec = Recorder(
        {
            ("POST", "/slurm/v0.0.40/job/submit"): (200, load("v0.0.40-submit-held.json")),
            ("DELETE", "/slurm/v0.0.40/jobs"): (200, load("v0.0.40-bulk-cancel.json")),
        }
    )
    b = backend(rec, "v0.0.40")
    try:
        await b.create("train", 1, SPEC.model_copy(update={"nodes": 2}), Plan(job="train"))
        await b.end_many(["3", "4"])
    finally:
        await b.aclose()
    assert rec.body(0)["script"].startswith("#!/bin/bash\nexec srun python")
    assert rec.body(0)["job"]["minimum_nodes"] == 2
    assert rec.body(1) == {"jobs": ["3", "4"]}


# ---------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize("version", ["v0.0.38", "v0.0.40", "v0.0.41"])
async def test_missing_job_is_fine_for_release_and_end(version: str) -> None:
    p = f"/slurm/{version}"
    missing = load(f"{version}-job-missing.json")
    rec = Recorder({("POST", f"{p}/job/999"): (500, missing), ("DELETE", f"{p}/job/999"): (500, missing)})
    b = backend(rec, version)
    try:
        await b.release("999")
        await b.end("999")
        await b.end("999")
    finally:
        await b.aclose()


@pytest.mark.parametrize("version", ["v0.0.40", "v0.0.41"])
async def test_update_results_are_checked(version: str) -> None:
    rec = Recorder({("POST", f"/slurm/{version}/job/3"): (200, load(f"{version}-update-failed.json"))})
    b = backend(rec, version)
    try:
        await b.release("3")  # 2021: already done; nothing to release
    finally:
        await b.aclose()
    assert V0040().check_update(load(f"{version}-update-failed.json")) == [
        (2021, "Job/step already completing or completed")
    ]


async def test_submit_never_fits_returns_the_job_and_bad_partition_is_refused() -> None:
    rec = Recorder({("POST", "/slurm/v0.0.38/job/submit"): (200, load("v0.0.38-submit-never-fits.json"))})
    b = backend(rec)
    try:
        assert await b.create("train", 1, SPEC, Plan(job="train")) == "74"
    finally:
        await b.aclose()
    for status, name in ((500, "v0.0.38-submit-bad-partition.json"), (500, "v0.0.38-submit-no-env.json")):
        rec = Recorder({("POST", "/slurm/v0.0.38/job/submit"): (status, load(name))})
        b = backend(rec)
        try:
            with pytest.raises(SlurmApiError) as err:
                await b.create("train", 1, SPEC, Plan(job="train"))
            assert not isinstance(err.value, TransientBackendError)
        finally:
            await b.aclose()


@pytest.mark.parametrize(
    ("status", "body", "needle"),
    [
        (500, load("v0.0.38-jobs-bad-token.json"), "expired token"),
        (500, load("v0.0.38-bad-token.json"), "expired token"),
        (401, {"errors": [{"error": "Authentication failure"}]}, "authentication failed"),
        (502, "<html>bad gateway</html>", "not JSON"),
        (200, "{not json", "not JSON"),
        (200, [1, 2], "JSON object"),
        (200, {"jobs": "nope"}, "'jobs' array"),
        (200, {"jobs": [{"name": "x"}]}, "job_id"),
        (503, "", "empty body"),
    ],
)
async def test_bad_answers_are_transient_and_never_show_the_token(
    status: int, body: object, needle: str
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if isinstance(body, str):
            return httpx.Response(status, text=body + TOKEN if body else "")
        return reply(status, body)

    b = backend(handler)
    try:
        with pytest.raises(TransientBackendError) as err:
            await b.list("train")
    finally:
        await b.aclose()
    assert needle in str(err.value)
    assert TOKEN not in str(err.value)
    assert "s3cr3t" not in str(err.value)


async def test_timeouts_and_refused_connections_are_transient() -> None:
    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError(f"refused while sending {TOKEN}", request=request)

    for handler, needle in ((slow, "no answer within"), (refused, "cannot connect")):
        b = backend(handler)
        try:
            with pytest.raises(TransientBackendError) as err:
                await b.release("3")
        finally:
            await b.aclose()
        assert needle in str(err.value)
        assert TOKEN not in str(err.value)


async def test_token_file_is_reread_when_it_changes(tmp_path: Path) -> None:
    f = tmp_path / "token"
    f.write_text("SLURM_JWT=first\n")
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["X-SLURM-USER-TOKEN"])
        return reply(200, load("v0.0.38-ok.json"))

    config = SlurmConfig(
        url="http://slurm.test", user_name="dispatch", token_file=str(f), api_version="v0.0.38"
    )
    b = SlurmBackend(config, transport=httpx.MockTransport(handler))
    try:
        await b.release("3")
        f.write_text("second")
        os.utime(f, (1, 1))  # a new mtime, as a Secret update gives
        await b.release("3")
    finally:
        await b.aclose()
    assert seen == ["first", "second"]


async def test_version_probe_newest_first() -> None:
    rec = Recorder({("GET", "/slurm/v0.0.40/ping"): (200, {"pings": [], "errors": []})})
    b = backend(rec, None)
    try:
        d = await b.dialect()
    finally:
        await b.aclose()
    assert isinstance(d, V0040)
    assert not isinstance(d, V0041)
    assert [r.url.path for r in rec.requests] == ["/slurm/v0.0.41/ping", "/slurm/v0.0.40/ping"]
    assert b.rest.bearer


def test_dialect_for() -> None:
    assert isinstance(dialect_for("v0.0.38"), V0038)
    assert isinstance(dialect_for("0.0.41"), V0041)
    d: Dialect = dialect_for("v0.0.42")
    assert d.version == "v0.0.42"
    assert isinstance(d, V0041)
    with pytest.raises(ValueError, match="not supported"):
        dialect_for("v0.0.39")


def test_config_needs_one_endpoint() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        SlurmConfig()
    with pytest.raises(ValueError, match="exactly one"):
        SlurmConfig(url="http://a", socket="/run/s")
    assert "s3cr3t" not in repr(SlurmConfig(url="http://a", token=TOKEN))


async def test_unix_socket_transport(tmp_path: Path) -> None:
    b = open_adapter({"socket": str(tmp_path / "none.sock"), "api_version": "v0.0.38"})
    try:
        with pytest.raises(TransientBackendError, match="cannot connect"):
            await b.list("x")
    finally:
        await b.aclose()


# ---------------------------------------------------------------------------------------- listing


async def test_list_filters_by_tag_and_user_and_remembers() -> None:
    state = {"jobs": load("v0.0.38-jobs.json")}

    def handler(request: httpx.Request) -> httpx.Response:
        return reply(200, state["jobs"])

    b = backend(handler, poll_interval=0.01)
    try:
        views = {v.id: v for v in await b.list("table")}
        assert "90" not in views
        assert "91" not in views
        assert views["1"].cause is not None
        assert views["1"].cause.kind is CauseKind.NONE
        assert views["24"].phase is Phase.HELD
        # Slurm forgets everything (MinJobAge): ended ones are remembered, live ones are reported gone.
        state["jobs"] = {"meta": {}, "errors": [], "jobs": []}
        b.poller.mark_dirty(1)
        after = {v.id: v for v in await b.list("table")}
        assert after["1"] == views["1"]
        assert after["24"].phase is Phase.ENDED
        assert after["24"].cause is not None
        assert after["24"].cause.kind is CauseKind.UNKNOWN
        assert "MinJobAge" in after["24"].cause.detail
    finally:
        await b.aclose()


async def test_stuck_jobs_are_cancelled_and_keep_their_cause() -> None:
    deleted: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "DELETE":
            deleted.append(request.url.path)
            return reply(200, load("v0.0.38-ok.json"))
        return reply(200, load("v0.0.38-jobs.json"))

    b = backend(handler)
    try:
        views = {v.id: v for v in await b.list("table")}
        for _ in range(20):
            if len(deleted) >= 3:
                break
            await asyncio.sleep(0.01)
    finally:
        await b.aclose()
    assert views["18"].cause is not None
    assert views["18"].cause.kind is CauseKind.NO_CAPACITY
    assert sorted(deleted) == sorted(f"/slurm/v0.0.38/job/{i}" for i in (6, 18, 19))


def test_planned_rule_shape() -> None:
    # The plan type the adapter reads (enforcer/action) as the core defines it.
    r = PlannedRule(
        index=0, on=(CauseKind.PREEMPTED,), action=Action.RESTART, budget=5, enforcer=Enforcer.SCHEDULER
    )
    assert r.left == 5


def test_default_output_path_does_not_use_the_job_name() -> None:
    """The operator's job ids hold a "/": an output path made from the Slurm job name (%x) breaks."""
    b = open_adapter({"url": "http://slurm.test", "working_directory": "/scratch"})
    spec = JobSpec(name="finetune", command=("true",))
    req = b.submit_request("team-a/finetune", 1, spec)
    assert req.name == "dispatch-team-a/finetune-1"
    assert req.standard_output == "/scratch/dispatch-%j.out"

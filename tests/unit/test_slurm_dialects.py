"""The Slurm dialects, the classifier and the REST error handling, against recorded responses.

Every response here was recorded from a real slurmrestd by ``hack/slurm-record.py`` (``make
slurm-record``): Slurm 22.05 (v0.0.38), 24.11 (v0.0.40-42) and 26.05 (v0.0.42-45). Faults (an empty
or truncated listing, an echoing page) are made by cutting or wrapping those recordings, as a
proxy in front of the real server would.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from dispatch import SlurmOptions
from dispatch._backends.slurm import _poller
from dispatch._backends.slurm._adapter import (
    CAPABILITIES,
    REFUSED_PREFIX,
    SlurmBackend,
    SlurmConfig,
    open_adapter,
)
from dispatch._backends.slurm._classify import classify
from dispatch._backends.slurm._dialects import PROBE_ORDER, V0038, V0040, V0041, V0045, SlurmJob, dialect_for
from dispatch._backends.slurm._poller import parse_tag
from dispatch._backends.slurm._rest import AuthenticationError
from dispatch._errors import PlanError, TransientBackendError
from dispatch._model import (
    Action,
    CauseKind,
    Enforcer,
    ExitCodeOperator,
    ExitCodes,
    JobSpec,
    Phase,
    Plan,
    RecoveryPolicy,
    Rule,
)
from dispatch._plan import make_plan

DATA = Path(__file__).parent / "data" / "slurm"
TOKEN = "eyJhbGciOiJIUzI1NiJ9.c2VjcmV0LXRva2Vu.s3cr3t-signature"

SERVED = {"22.05": ("v0.0.38",), "24.11": ("v0.0.40", "v0.0.41", "v0.0.42"), "26.05": PROBE_ORDER[:4][::-1]}
CASES = [(s, a) for s, apis in SERVED.items() for a in apis]
NEWEST = [(s, apis[-1]) for s, apis in SERVED.items()]
"""The scenario's jobs (preemption, refusals, cancels) were driven through each server's newest API."""
ids = pytest.mark.parametrize(("slurm", "api"), CASES, ids=[f"{s}-{a}" for s, a in CASES])
newest = pytest.mark.parametrize(("slurm", "api"), NEWEST, ids=[f"{s}-{a}" for s, a in NEWEST])


def rec(slurm: str, api: str, name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / slurm / api / f"{name}.json").read_text())
    return data


def index(slurm: str) -> dict[str, int]:
    jobs: dict[str, int] = json.loads((DATA / slurm / "index.json").read_text())["jobs"]
    return jobs


def response(r: dict[str, Any]) -> httpx.Response:
    body = r["body"]
    if isinstance(body, dict) and "__text__" in body:
        return httpx.Response(r["status"], text=body["__text__"])
    if r["status"] == 304:
        return httpx.Response(304)
    return httpx.Response(r["status"], json=body)


Handler = Callable[[httpx.Request], httpx.Response]


class Replay:
    """A slurmrestd that answers with recordings: ``routes`` maps (method, path) to a recording name,
    or to a list of names answered in turn (the last one repeats)."""

    def __init__(self, slurm: str, api: str, routes: dict[tuple[str, str], str | list[str]]) -> None:
        self.slurm, self.api = slurm, api
        self.routes = {k: [v] if isinstance(v, str) else list(v) for k, v in routes.items()}
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        path = request.url.path.removeprefix(f"/slurm/{self.api}")
        names = self.routes.get((request.method, path))
        if names is None:
            return httpx.Response(404, text="not a recorded route")
        name = names.pop(0) if len(names) > 1 else names[0]
        return response(rec(self.slurm, self.api, name))

    def sent(self, method: str, path: str) -> list[httpx.Request]:
        return [r for r in self.requests if r.method == method and r.url.path == f"/slurm/{self.api}{path}"]


def backend(handler: Handler, api: str | None, **cfg: Any) -> SlurmBackend:
    config = SlurmConfig.model_validate(
        {"url": "http://slurm.test", "user_name": "dispatch", "token": TOKEN, "api_version": api, **cfg}
    )
    return SlurmBackend(config, transport=httpx.MockTransport(handler))


def jobs_of(slurm: str, api: str, name: str = "jobs") -> dict[int, SlurmJob]:
    return {j.job_id: j for j in dialect_for(api).parse_jobs(rec(slurm, api, name)["body"])}


# ---------------------------------------------------------------------------------------- parsing

EXPECTED: dict[str, tuple[Phase, CauseKind | None]] = {
    "ok": (Phase.ENDED, CauseKind.NONE),
    "nz": (Phase.ENDED, CauseKind.NON_ZERO_EXIT),
    "sig": (Phase.ENDED, CauseKind.UNKNOWN),
    "pc": (Phase.ENDED, CauseKind.PREEMPTED),
    "pr": (Phase.ENDED, CauseKind.PREEMPTED),
    "nodefail": (Phase.ENDED, CauseKind.NODE_LOST),
    "tl": (Phase.ENDED, CauseKind.TIME_LIMIT),
    "cancelled": (Phase.ENDED, CauseKind.UNKNOWN),
    "fit-cpus": (Phase.ENDED, CauseKind.NO_CAPACITY),
    "fit-mem": (Phase.ENDED, CauseKind.NO_CAPACITY),
    "fit-nodes": (Phase.HELD, None),
}


@ids
def test_every_recorded_job_is_classified(slurm: str, api: str) -> None:
    jobs = jobs_of(slurm, api)
    names = index(slurm)
    for key, (phase, kind) in EXPECTED.items():
        c = classify(jobs[names[key]])
        assert c.phase is phase, (key, jobs[names[key]])
        assert (c.cause.kind if c.cause else None) is kind, (key, c.cause)
    assert jobs[names["nz"]].exit_status == 3
    assert jobs[names["sig"]].signal == 9
    sig = classify(jobs[names["sig"]]).cause
    assert sig is not None
    assert "SIGKILL" in sig.detail
    assert "out-of-memory" in sig.detail  # what cannot be told apart without cgroups
    assert classify(jobs[names["cancelled"]]).cancelled
    assert classify(jobs[names["fit-mem"]]).stuck  # held by Slurm with BadConstraints: cancelled
    for a in SERVED[slurm]:
        assert classify(jobs[names[f"held-{a}"]]).phase is Phase.HELD
        assert parse_tag(jobs[names[f"held-{a}"]].comment) == (f"rec-held-{a}", 1)
    assert parse_tag(jobs[names["blocker"]].comment) is None  # not dispatch's


@ids
def test_a_recorded_exit_code_is_what_a_rule_on_codes_matches(slurm: str, api: str) -> None:
    """The job that exited 3 gives its code to the rules; the one killed by SIGKILL has a signal and
    no exit code, and is no non-zero-exit (its cause is unknown): no rule on codes takes it."""
    jobs = jobs_of(slurm, api)
    names = index(slurm)
    nz = classify(jobs[names["nz"]]).cause
    sig = classify(jobs[names["sig"]]).cause
    assert nz is not None
    assert sig is not None
    assert (nz.kind, nz.exit_code, nz.signal) == (CauseKind.NON_ZERO_EXIT, 3, None)
    assert (sig.exit_code, sig.signal) == (None, 9)
    three = ExitCodes(operator=ExitCodeOperator.IN, values=(3,))
    policy = RecoveryPolicy(
        rules=(
            Rule(
                on=(CauseKind.NON_ZERO_EXIT,),
                budget=1,
                exit_codes=ExitCodes(operator=ExitCodeOperator.IN, values=(137,)),
            ),
            Rule(on=(CauseKind.NON_ZERO_EXIT,), budget=1, exit_codes=three),
        )
    )
    assert policy.rule_for(nz) == 1
    assert policy.rule_for(sig) is None


@ids
def test_held_submit_answer_and_record(slurm: str, api: str) -> None:
    d = dialect_for(api)
    assert d.parse_submit(rec(slurm, api, "submit-held")["body"]) == index(slurm)[f"held-{api}"]
    [job] = d.parse_jobs(rec(slurm, api, "job-held")["body"])
    assert (job.state, job.hold, job.requeue) == ("PENDING", True, False) or isinstance(d, V0038)
    assert classify(job).phase is Phase.HELD


def test_a_released_job_that_waits_says_slurms_reason() -> None:
    """squeue's REASON becomes the view's ``waiting`` (status's note); none before slurmctld has
    looked at the job (reason ``None``), and none for a job dispatch still holds."""
    waits = classify(SlurmJob(job_id=1, state="PENDING", reason="Resources"))
    assert (waits.phase, waits.waiting) == (Phase.QUEUED, "pending in Slurm: reason Resources")
    described = classify(SlurmJob(job_id=1, state="PENDING", reason="ReqNodeNotAvail", description="x down"))
    assert described.waiting == "pending in Slurm: reason ReqNodeNotAvail (x down)"
    assert classify(SlurmJob(job_id=1, state="PENDING", reason="None")).waiting == ""
    held = classify(SlurmJob(job_id=1, state="PENDING", reason="JobHeldUser", hold=True))
    assert (held.phase, held.waiting) == (Phase.HELD, "")


def test_unknown_state_is_never_an_end() -> None:
    assert classify(SlurmJob(job_id=1, state="SOMETHING_NEW")).phase is Phase.RUNNING


@pytest.mark.parametrize(("slurm", "api"), CASES[1:], ids=[f"{s}-{a}" for s, a in CASES[1:]])
def test_job_states_listing(slurm: str, api: str) -> None:
    d = dialect_for(api)
    assert isinstance(d, V0040)
    states = d.parse_states(rec(slurm, api, "jobs-state")["body"])
    names = index(slurm)
    assert states[names["ok"]] == ("COMPLETED", frozenset())
    assert states[names[f"held-{api}"]][0] == "PENDING"
    assert set(states) == set(jobs_of(slurm, api))


# ---------------------------------------------------------------------------------------- requests

SPEC = JobSpec(
    name="train",
    command=("python", "train.py", "--lr", "0.1 x"),
    time_limit_seconds=241,  # Slurm's whole minutes, rounded up: 5
    slurm=SlurmOptions(partition="low", cpus_per_task=2, environment={"A": "1"}),
)


@newest
async def test_submit_release_cancel(slurm: str, api: str) -> None:
    replay = Replay(
        slurm,
        api,
        {
            ("POST", "/job/submit"): "submit-held",
            ("POST", f"/job/{index(slurm)[f'held-{api}']}"): "update-ok",
            ("DELETE", f"/job/{index(slurm)[f'held-{api}']}"): "cancel-ok",
        },
    )
    b = backend(replay, api)
    try:
        oid = await b.create("train", 2, SPEC, Plan(job="train"))
        assert oid == str(index(slurm)[f"held-{api}"])
        await b.release(oid)
        await b.end(oid)
    finally:
        await b.aclose()
    submit = json.loads(replay.requests[0].content)
    job = submit["job"]
    assert (job["name"], job["comment"], job["hold"]) == (
        "dispatch-train-2",
        "dispatch:job=train;submission=2",
        True,
    )
    script = job["script"] if api != "v0.0.38" else submit["script"]
    assert script == "#!/bin/bash\nexec python train.py --lr '0.1 x'\n"
    if api == "v0.0.38":
        assert (job["no_requeue"], "requeue" in job, job["time_limit"]) == (True, False, 5)
        assert job["environment"]["DISPATCH_SUBMISSION"] == "2"
    else:
        assert job["requeue"] is False
        assert "DISPATCH_JOB=train" in job["environment"]
        assert job["time_limit"] == {"set": True, "infinite": False, "number": 5}
    assert json.loads(replay.requests[1].content) == {"hold": False}
    for r in replay.requests:
        assert r.headers["X-SLURM-USER-NAME"] == "dispatch"
        assert r.headers["X-SLURM-USER-TOKEN"] == TOKEN
        # 24.11+ refuse X-SLURM-USER-TOKEN together with Authorization (recorded: 401).
        assert "Authorization" not in r.headers


def test_script_placement_per_dialect() -> None:
    req = open_adapter({"url": "http://x"}).submit_request("j", 1, SPEC)
    assert "script" in V0038().submit_body(req)
    assert "script" in V0040().submit_body(req)
    assert "script" not in V0041().submit_body(req)
    assert "script" in V0041().submit_body(req)["job"]
    assert V0045().submit_body(req) == V0041().submit_body(req)


async def test_multi_node_uses_srun_and_bulk_cancel() -> None:
    slurm, api = "26.05", "v0.0.45"
    replay = Replay(slurm, api, {("POST", "/job/submit"): "submit-held", ("DELETE", "/jobs"): "bulk-cancel"})
    b = backend(replay, api)
    try:
        await b.create("train", 1, SPEC.model_copy(update={"nodes": 2}), Plan(job="train"))
        await b.end_many(["3", "4"])
    finally:
        await b.aclose()
    assert json.loads(replay.requests[0].content)["job"]["script"].startswith("#!/bin/bash\nexec srun python")
    assert json.loads(replay.requests[1].content) == {"jobs": ["3", "4"]}


def test_never_requeueable_and_no_native_rule() -> None:
    b = open_adapter({"url": "http://slurm.test"})
    assert b.capabilities.native == ()
    assert b.capabilities is CAPABILITIES
    rules = RecoveryPolicy(rules=(Rule(on=(CauseKind.PREEMPTED, CauseKind.NODE_LOST), budget=5),))
    spec = SPEC.model_copy(update={"recovery": rules})
    assert make_plan("x", spec, b.capabilities, supervised=True).rules[0].enforcer is Enforcer.SUPERVISOR
    req = b.submit_request("x", 1, spec)
    assert V0038().submit_body(req)["job"]["no_requeue"] is True
    assert V0045().submit_body(req)["job"]["requeue"] is False
    restart = RecoveryPolicy(rules=(Rule(on=(CauseKind.PREEMPTED,), action=Action.RESTART, budget=5),))
    with pytest.raises(PlanError, match="it enforces nothing"):
        make_plan("x", SPEC.model_copy(update={"recovery": restart}), b.capabilities, supervised=True)
    with pytest.raises(ValidationError, match="max_batch_requeue"):
        open_adapter({"url": "http://slurm.test", "max_batch_requeue": 5})


def test_default_output_path_does_not_use_the_job_name() -> None:
    """The operator's job ids hold a "/": an output path made from the Slurm job name (%x) breaks."""
    b = open_adapter({"url": "http://slurm.test", "working_directory": "/scratch"})
    req = b.submit_request("team-a/finetune", 1, JobSpec(name="finetune", command=("true",)))
    assert req.name == "dispatch-team-a/finetune-1"
    assert req.standard_output == "/scratch/dispatch-%j.out"


# ---------------------------------------------------------------------------------------- the probe


@pytest.mark.parametrize("slurm", list(SERVED))
async def test_probe_is_authenticated_and_picks_the_newest_served(slurm: str) -> None:
    served = SERVED[slurm]
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        api = request.url.path.split("/")[2]
        name = "licenses" if api in served else "licenses-not-served"
        return response(rec(slurm, api, name))

    b = backend(handler, None)
    try:
        d = await b.dialect()
    finally:
        await b.aclose()
    assert d.version == served[-1]
    assert seen == [f"/slurm/{a}/licenses" for a in PROBE_ORDER[: PROBE_ORDER.index(served[-1]) + 1]]


@pytest.mark.parametrize("slurm", list(SERVED))
async def test_a_probe_with_a_rejected_token_says_so(slurm: str) -> None:
    # A ping succeeds with a garbage token on 24.11+ (recorded); the probe asks /licenses instead.
    newest_api = SERVED[slurm][-1]
    assert rec(slurm, newest_api, "ping-bad-token")["status"] == (200 if slurm != "22.05" else 500)
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        api = request.url.path.split("/")[2]
        return response(
            rec(slurm, api, "licenses-bad-token" if api in SERVED[slurm] else "licenses-not-served")
        )

    b = backend(handler, None)
    try:
        with pytest.raises(AuthenticationError, match="token rejected or expired") as err:
            await b.list("x")
    finally:
        await b.aclose()
    assert TOKEN not in str(err.value)
    assert seen[-1] == f"/slurm/{newest_api}/licenses"  # stopped there: not read as "not served"


# ---------------------------------------------------------------------------------------- errors


@ids
@pytest.mark.parametrize("name", ["jobs-bad-token", "jobs-expired-token", "jobs-token-and-bearer"])
async def test_authentication_failures_read_as_a_rejected_token(slurm: str, api: str, name: str) -> None:
    if name == "jobs-token-and-bearer" and slurm == "22.05":
        assert rec(slurm, api, name)["status"] == 200  # 22.05 ignores Authorization (recorded)
        return
    b = backend(Replay(slurm, api, {("GET", "/jobs"): name}), api)
    try:
        with pytest.raises(AuthenticationError, match="token rejected or expired") as err:
            await b.list("x")
    finally:
        await b.aclose()
    assert isinstance(err.value, TransientBackendError)  # a rotated token file fixes it
    assert "not served" not in str(err.value)
    assert TOKEN not in str(err.value)


@ids
async def test_missing_job_is_fine_for_release_and_end(slurm: str, api: str) -> None:
    replay = Replay(
        slurm, api, {("POST", "/job/999999"): "update-missing", ("DELETE", "/job/999999"): "cancel-missing"}
    )
    b = backend(replay, api)
    try:
        await b.release("999999")
        await b.end("999999")
        await b.end("999999")
    finally:
        await b.aclose()
    assert replay.requests[0].url.path.endswith("/job/999999")


@newest
async def test_a_release_that_can_never_fit_is_no_capacity(slurm: str, api: str) -> None:
    held = index(slurm)[f"held-{api}"]
    replay = Replay(
        slurm,
        api,
        {
            ("GET", "/jobs"): "jobs",
            ("POST", f"/job/{held}"): "release-fit-cpus",  # 500 (422 on 26.05) with error 2015
            ("DELETE", f"/job/{held}"): "cancel-ok",
        },
    )
    b = backend(replay, api)
    try:
        [view] = await b.list(f"rec-held-{api}")
        assert view.phase is Phase.HELD
        await b.release(view.id)  # an answer, not an error: supervision goes on
        [after] = await b.list(f"rec-held-{api}")
    finally:
        await b.aclose()
    assert replay.sent("DELETE", f"/job/{held}")
    assert after.phase is Phase.ENDED
    assert after.cause is not None
    assert after.cause.kind is CauseKind.NO_CAPACITY
    assert "[2015]" in after.cause.detail
    assert "dispatch cancelled it" in after.cause.detail


@ids
async def test_a_refused_submission_is_a_recorded_outcome(slurm: str, api: str) -> None:
    replay = Replay(slurm, api, {("POST", "/job/submit"): "submit-bad-partition", ("GET", "/jobs"): "jobs"})
    b = backend(replay, api)
    try:
        oid = await b.create("train", 1, SPEC, Plan(job="train"))
        assert oid.startswith(REFUSED_PREFIX)
        await b.release(oid)
        await b.end(oid)
        [view] = await b.list("train")
    finally:
        await b.aclose()
    assert len(replay.sent("POST", "/job/submit")) == 1  # neither release nor cancel is sent
    assert (view.id, view.phase) == (oid, Phase.ENDED)
    assert view.cause is not None
    assert view.cause.kind is CauseKind.LAUNCH_FAILED
    assert "[2000]" in view.cause.detail


@newest
async def test_a_refused_cancel_is_retried_not_final(slurm: str, api: str) -> None:
    b = backend(Replay(slurm, api, {("DELETE", "/job/5"): "submit-bad-partition"}), api)
    try:
        with pytest.raises(TransientBackendError):
            await b.end("5")
    finally:
        await b.aclose()


# ---------------------------------------------------------------------------------------- secrets

ECHO_PAGES: list[tuple[int, str]] = [
    (502, "<html><body>Bad gateway. Your request: X-SLURM-USER-TOKEN: {tok}</body></html>"),
    (200, "GET /slurm/jobs HTTP/1.1\r\nX-SLURM-USER-TOKEN: {tok}\r\n\r\n"),
    (500, '{{"errors": [{{"error_number": 5000, "description": "bad token {tok}"}}]}}'),
    (422, '{{"errors": [{{"error_number": 9000, "description": "cannot parse {tok}"}}]}}'),
    (401, "Authentication failure for {tok}"),
    (511, '{{"errors": [{{"error_number": 1007, "description": "{tok}"}}]}}'),
    (
        503,
        "an old token eyJhbGciOiJIUzI1NiJ9.b2xkLXRva2Vu.b2xkLXNpZ25hdHVyZQ, the signature s3cr3t-signature",
    ),
]


@pytest.mark.parametrize(("status", "page"), ECHO_PAGES)
async def test_the_token_is_never_shown_whatever_the_answer(
    status: int, page: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(f"  SLURM_JWT={TOKEN}  \n\n")  # as a Secret or `scontrol token` may hold it

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.headers["X-SLURM-USER-TOKEN"] == TOKEN  # whitespace and prefix removed
        return httpx.Response(status, text=page.format(tok=request.headers["X-SLURM-USER-TOKEN"]))

    caplog.set_level(logging.DEBUG)
    b = backend(handler, "v0.0.42", token=None, token_file=str(token_file))
    try:
        for call in (b.list("x"), b.release("3"), b.end("3"), b.create("x", 1, SPEC, Plan(job="x"))):
            try:
                out = await call
            except TransientBackendError as e:
                text = str(e)
            else:
                text = repr(out) + repr(b._refused)  # a refused submission: its recorded cause
            for secret in (TOKEN, "s3cr3t-signature", "b2xkLXNpZ25hdHVyZQ"):
                assert secret not in text
    finally:
        await b.aclose()
    assert TOKEN not in caplog.text
    assert "s3cr3t" not in caplog.text


@pytest.mark.parametrize(
    ("status", "body", "needle"),
    [
        (502, "<html>bad gateway</html>", "not JSON"),
        (200, "{not json", "not JSON"),
        (200, "[1, 2]", "JSON object"),
        (200, '{"jobs": "nope"}', "'jobs' array"),
        (200, '{"jobs": [{"name": "x"}]}', "job_id"),
        (503, "", "empty body"),
    ],
)
async def test_garbage_is_transient(status: int, body: str, needle: str) -> None:
    b = backend(lambda r: httpx.Response(status, text=body), "v0.0.42")
    try:
        with pytest.raises(TransientBackendError, match=needle):
            await b.list("x")
    finally:
        await b.aclose()


async def test_timeouts_and_refused_connections_are_transient() -> None:
    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError(f"refused while sending {TOKEN}", request=request)

    for handler, needle in ((slow, "no answer within"), (refused, "cannot connect")):
        b = backend(handler, "v0.0.38")
        try:
            with pytest.raises(TransientBackendError, match=needle) as err:
                await b.release("3")
        finally:
            await b.aclose()
        assert TOKEN not in str(err.value)


async def test_token_file_is_reread_when_it_changes(tmp_path: Path) -> None:
    f = tmp_path / "token"
    f.write_text("SLURM_JWT=first\n")
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["X-SLURM-USER-TOKEN"])
        return response(rec("22.05", "v0.0.38", "update-ok"))

    b = backend(handler, "v0.0.38", token=None, token_file=str(f))
    try:
        await b.release("3")
        f.write_text("second")
        os.utime(f, (1, 1))  # a new mtime, as a Secret update gives
        await b.release("3")
    finally:
        await b.aclose()
    assert seen == ["first", "second"]


def test_dialects_and_config() -> None:
    assert PROBE_ORDER == ("v0.0.45", "v0.0.44", "v0.0.43", "v0.0.42", "v0.0.41", "v0.0.40", "v0.0.38")
    assert dialect_for("0.0.43").version == "v0.0.43"
    with pytest.raises(ValueError, match="not supported"):
        dialect_for("v0.0.39")
    with pytest.raises(ValueError, match="not a slurmrestd API version"):
        dialect_for("latest")
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


# ---------------------------------------------------------------------------------------- listings


def cut(slurm: str, api: str, name: str, keep: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """A recording with only some of its jobs: what an empty or truncated answer looks like."""
    r: dict[str, Any] = json.loads(json.dumps(rec(slurm, api, name)))
    r["body"]["jobs"] = [j for j in r["body"]["jobs"] if keep(j)]
    return r


@newest
async def test_absent_from_one_answer_is_confirmed_by_a_lookup(slurm: str, api: str) -> None:
    held = index(slurm)[f"held-{api}"]
    job = f"rec-held-{api}"
    answers = {"jobs": [rec(slurm, api, "jobs"), cut(slurm, api, "jobs", lambda j: False)]}
    found = {"on": True}

    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path.removeprefix(f"/slurm/{api}")
        if request.method == "DELETE":  # the stuck jobs of the recording (never fit) are cancelled
            return response(rec(slurm, api, "cancel-missing"))
        if path == "/jobs":
            return response(answers["jobs"].pop(0) if len(answers["jobs"]) > 1 else answers["jobs"][0])
        if path == "/jobs/state/":
            if found["on"]:
                return response(rec(slurm, api, "jobs-state"))
            return response(cut(slurm, api, "jobs-state", lambda j: int(j["job_id"]) != held))
        if path.startswith("/job/"):  # v0.0.38: one lookup per job
            ok = found["on"] and path == f"/job/{held}"
            return response(rec(slurm, api, "job-held" if ok else "job-missing"))
        return httpx.Response(404)

    b = backend(handler, api)
    try:
        [first] = await b.list(job)
        assert first.phase is Phase.HELD
        await b.poller.refresh()  # the next cycle: an empty listing, and the lookup still finds it
        assert b.poller.views(job) == [first]
        assert b.poller.lookups == 1
        assert b.poller.contradicted >= 1
        found["on"] = False  # now Slurm really has forgotten it
        await b.poller.refresh()
        [gone] = await b.list(job)
    finally:
        await b.aclose()
    assert gone.phase is Phase.ENDED
    assert gone.cause is not None
    assert gone.cause.kind is CauseKind.UNKNOWN
    assert "confirmed by a direct lookup" in gone.cause.detail
    if api == "v0.0.38":
        assert "shows no job at all" in gone.cause.detail
    else:  # jobs/state still shows later job ids: Slurm moved past it and forgot it
        assert "MinJobAge" in gone.cause.detail


@newest
async def test_a_lookup_that_fails_applies_nothing(slurm: str, api: str) -> None:
    answers = [rec(slurm, api, "jobs"), cut(slurm, api, "jobs", lambda j: False)]

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/jobs"):
            return response(answers.pop(0) if len(answers) > 1 else answers[0])
        return httpx.Response(503, text="")

    b = backend(handler, api)
    try:
        [first] = await b.list(f"rec-held-{api}")
        with pytest.raises(TransientBackendError):
            await b.poller.refresh()
        assert b.poller.view(int(first.id)) == first
    finally:
        await b.aclose()


@pytest.mark.parametrize(("slurm", "api"), NEWEST[1:], ids=[f"{s}-{a}" for s, a in NEWEST[1:]])
async def test_an_answer_older_than_one_already_read_is_refused(slurm: str, api: str) -> None:
    # jobs-running was recorded earlier than jobs (its last_update is older): a proxy replaying it.
    assert (
        rec(slurm, api, "jobs-running")["body"]["last_update"]["number"]
        < rec(slurm, api, "jobs")["body"]["last_update"]["number"]
    )
    answers = [rec(slurm, api, "jobs"), rec(slurm, api, "jobs-running")]
    b = backend(
        lambda r: response(answers.pop(0) if len(answers) > 1 else answers[0]), api, full_refresh_every=1
    )
    try:
        views = await b.list("rec-ok")
        with pytest.raises(TransientBackendError, match="older than one already read"):
            await b.poller.refresh()
        assert b.poller.views("rec-ok") == views
    finally:
        await b.aclose()


class _Clock:
    """The poller's ``time`` module with a monotonic clock the test moves: how old a listing is
    must not depend on how long the machine takes to answer 101 calls."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.time = time.time

    def monotonic(self) -> float:
        return self.now


@ids
async def test_list_answers_from_a_listing_at_most_one_interval_old(
    slurm: str, api: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Calls within an interval share the last listing; an older one is never used. After a full
    listing: 22.05 answers update_time with 304, 24.11+'s v0.0.42+ with an empty 200 (both: nothing
    changed), 24.11's v0.0.40/41 refuse it (422) so it is never sent."""
    clock = _Clock()
    monkeypatch.setattr(_poller, "time", clock)
    unchanged = "jobs-since-future"
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "DELETE":  # the stuck jobs of the recording (never fit) are cancelled
            return response(rec(slurm, api, "cancel-missing"))
        seen.append(request)
        name = unchanged if "update_time" in request.url.params else "jobs"
        return response(rec(slurm, api, name))

    job = f"rec-held-{api}"
    b = backend(handler, api, poll_interval=0.2)  # no subscriber: no loop, only list() lists
    try:
        first = await b.list(job)
        await asyncio.gather(*(b.list(job) for _ in range(100)))
        assert len(seen) == 1  # one listing for 101 calls within the interval
        clock.now += 0.35
        assert await b.list(job) == first  # older than max_age (0.3 s): a new listing first
        assert len(seen) == 2
    finally:
        await b.aclose()
    with_time = [r for r in seen if "update_time" in r.url.params]
    if api in ("v0.0.40", "v0.0.41"):
        assert with_time == []
        assert rec(slurm, api, unchanged)["status"] == 422
    else:
        assert len(with_time) == 1
        assert b.poller.not_modified == 1


async def test_a_new_object_is_returned_only_after_max_age() -> None:
    """What keeps decide's ordering rule across processes sharing nothing but Slurm (docs/slurm.md)."""
    slurm, api = "26.05", "v0.0.45"
    replay = Replay(slurm, api, {("POST", "/job/submit"): "submit-held", ("GET", "/jobs"): "jobs"})
    b = backend(replay, api, poll_interval=0.3)
    try:
        await b.list(f"rec-held-{api}")
        t0 = asyncio.get_running_loop().time()
        oid = await b.create("train", 1, SPEC, Plan(job="train"))
        [view] = await b.list("train")
        waited = asyncio.get_running_loop().time() - t0
    finally:
        await b.aclose()
    assert (view.id, view.phase) == (oid, Phase.HELD)
    assert b.poller.max_age == pytest.approx(0.45)  # 1.5 intervals
    assert waited >= 0.44


async def test_stuck_jobs_are_cancelled_and_keep_their_cause() -> None:
    slurm, api = "26.05", "v0.0.45"
    deleted: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "DELETE":
            deleted.append(request.url.path)
            return response(rec(slurm, api, "cancel-ok"))
        return response(rec(slurm, api, "jobs"))

    b = backend(handler, api)
    try:
        [view] = await b.list("rec-fit-mem")
        for _ in range(50):
            if deleted:
                break
            await asyncio.sleep(0.01)
    finally:
        await b.aclose()
    assert view.cause is not None
    assert view.cause.kind is CauseKind.NO_CAPACITY
    assert f"/slurm/{api}/job/{index(slurm)['fit-mem']}" in deleted

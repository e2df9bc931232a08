"""The supervisor over the Slurm bridge when things go wrong, on each real Slurm (22.05, 24.11, 26.05).

Jobs that can never fit, a killed slurmd, slurmrestd killed and started again mid-run, a proxy in
front of slurmrestd answering garbage, empty and truncated listings, 5xx, slow and echoing pages,
an expired then rotated token file, and two supervisors (two processes' worth of backend, sharing
only Slurm and the record store) racing on one job. Throughout: no healthy job is recorded failed,
supervision never stops while a released job runs, the token is never logged.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from dispatch import SlurmOptions
from dispatch._backends.slurm._adapter import SlurmBackend, open_adapter
from dispatch._cluster import Cluster, compose
from dispatch._memstore import MemoryStore
from dispatch._model import (
    CauseKind,
    JobSpec,
    ObjectView,
    Phase,
    Plan,
    Record,
    State,
)
from dispatch._supervisor import Supervisor
from tests.support.builders import ALICE
from tests.support.slurmlab import SlurmLab
from tests.support.slurmproxy import FaultProxy

pytestmark = [pytest.mark.integration, pytest.mark.slurm]


def tagged(slurm: SlurmLab, job: str) -> dict[str, dict[str, str]]:
    """Every Slurm job tagged for ``job`` that Slurm still shows: id -> scontrol's fields."""
    out: dict[str, dict[str, str]] = {}
    for jid in slurm.run("squeue", "-h", "-t", "all", "-o", "%i").split():
        info = slurm.job_state(jid)
        if info.get("Comment") == f"dispatch:job={job};submission=1" or info.get("JobName", "").startswith(
            f"dispatch-{job}-"
        ):
            out[jid] = info
    return out


async def supervise(cluster: Cluster, spec: JobSpec, within: float = 120) -> Record:
    await cluster.operator.submit(spec, ALICE, supervised=True)
    return await asyncio.wait_for(cluster.supervisor(poll_interval=1.0).run(spec.name), within)


async def supervised_and_running(
    cluster: Cluster, backend: SlurmBackend, spec: JobSpec
) -> asyncio.Task[Record]:
    """Submit ``spec`` supervised, start its supervisor, and return once its object runs."""
    await cluster.operator.submit(spec, ALICE, supervised=True)
    run = asyncio.create_task(cluster.supervisor(poll_interval=1.0).run(spec.name))
    await _wait(backend, spec.name, lambda v: v.phase is Phase.RUNNING, 60)
    return run


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG, logger="dispatch")
    return caplog


@pytest.mark.parametrize(
    ("what", "options"),
    [
        ("cpus", {"cpus_per_task": 64}),
        ("nodes", {}),
        ("memory", {"memory_per_node_mb": 100000}),
    ],
)
async def test_a_job_that_can_never_fit_is_no_capacity(
    slurm: SlurmLab, what: str, options: dict[str, int]
) -> None:
    name = f"fit-{what}"
    spec = JobSpec(
        name=name,
        command=("true",),
        nodes=5 if what == "nodes" else 1,
        slurm=SlurmOptions.model_validate(options),
    )
    backend = open_adapter(slurm.backend_config(poll_interval=0.5))
    try:
        record = await supervise(compose(backend), spec, within=60)
    finally:
        await backend.aclose()
    assert record.state is State.FAILED, record
    cause = record.submissions[0].cause
    assert cause is not None
    assert cause.kind is CauseKind.NO_CAPACITY, cause
    assert record.settled
    [info] = tagged(slurm, name).values() or [{}]
    assert info.get("JobState") in ("CANCELLED", None), info  # cancelled by dispatch, never ran
    assert info.get("RunTime", "00:00:00") == "00:00:00", info


async def test_a_killed_slurmd_is_node_lost(slurm: SlurmLab) -> None:
    backend = open_adapter(slurm.backend_config(poll_interval=0.5))
    try:
        oid = await backend.create("ks", 1, JobSpec(name="ks", command=("sleep", "300")), _plan("ks"))
        await backend.release(oid)
        await _wait(backend, "ks", lambda v: v.phase is Phase.RUNNING, 60)
        slurm.kill("slurmd")  # SIGKILL: the node stops answering; SlurmdTimeout (10 s) later it is down
        view = await _wait(backend, "ks", lambda v: v.phase is Phase.ENDED, 90)
    finally:
        await backend.aclose()
    assert view.cause is not None
    assert view.cause.kind is CauseKind.NODE_LOST, view


async def test_slurmrestd_killed_and_started_again_mid_run(
    slurm: SlurmLab, logs: pytest.LogCaptureFixture
) -> None:
    backend = open_adapter(slurm.backend_config(poll_interval=0.5, request_timeout=2))
    cluster = compose(backend)
    spec = JobSpec(name="rr", command=("sleep", "8"))
    try:
        run = await supervised_and_running(cluster, backend, spec)
        slurm.kill("slurmrestd")
        await asyncio.sleep(3)
        assert not run.done()  # supervision goes on while the released job runs
        await asyncio.to_thread(slurm.start_slurmrestd)
        record = await asyncio.wait_for(run, 90)
    finally:
        await cluster.aclose()
    assert record.state is State.SUCCEEDED, record
    assert len(record.submissions) == 1
    assert "cannot connect" in logs.text
    assert slurm.token not in logs.text


async def test_a_proxy_answering_faults_for_a_while(slurm: SlurmLab, logs: pytest.LogCaptureFixture) -> None:
    with FaultProxy(slurm.url, slow_seconds=2.5) as proxy:
        backend = open_adapter(
            slurm.backend_config(url=proxy.url, poll_interval=0.3, request_timeout=1.5, max_backoff=1.0)
        )
        cluster = compose(backend)
        spec = JobSpec(name="px", command=("sleep", "25"))
        try:
            run = await supervised_and_running(cluster, backend, spec)
            for mode in ("empty", "garbage", "truncate", "5xx", "stale", "slow", "echo", "empty"):
                proxy.mode = mode
                before = proxy.served[mode]
                deadline = time.monotonic() + 15
                while proxy.served[mode] < before + 2:  # at least two answers of each kind
                    assert time.monotonic() < deadline, (mode, proxy.served)
                    assert not run.done(), (mode, run)
                    await asyncio.sleep(0.1)
            proxy.mode = "pass"
            record = await asyncio.wait_for(run, 90)
        finally:
            await cluster.aclose()
    assert record.state is State.SUCCEEDED, record  # never recorded failed
    assert len(record.submissions) == 1, record
    assert record.submissions[0].cause is not None
    assert record.submissions[0].cause.kind is CauseKind.NONE
    assert backend.poller.lookups >= 1  # the empty listings were checked, not believed
    assert backend.poller.contradicted >= 1
    assert slurm.token not in logs.text
    assert slurm.token.rsplit(".", 1)[-1] not in logs.text


async def test_an_expired_token_then_a_rotated_token_file(
    slurm: SlurmLab, tmp_path: Path, logs: pytest.LogCaptureFixture
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(f"SLURM_JWT={slurm.mint_token(slurm.user_name, 6)}\n")
    config = {k: v for k, v in slurm.backend_config(poll_interval=0.5).items() if k != "token"}
    backend = open_adapter({**config, "token_file": str(token_file)})
    cluster = compose(backend)
    spec = JobSpec(name="tok", command=("sleep", "14"))
    try:
        run = await supervised_and_running(cluster, backend, spec)
        deadline = time.monotonic() + 30
        while "token rejected or expired" not in logs.text:  # the 6 s token expires
            assert time.monotonic() < deadline, "the expired token was never reported"
            assert not run.done()
            await asyncio.sleep(0.2)
        fresh = slurm.mint_token(slurm.user_name, 3600)
        token_file.write_text(f"  {fresh}\n")  # rotated, as a Secret update does (with stray whitespace)
        os.utime(token_file, None)
        record = await asyncio.wait_for(run, 90)
    finally:
        await cluster.aclose()
    assert record.state is State.SUCCEEDED, record
    assert len(record.submissions) == 1
    assert fresh not in logs.text
    assert slurm.token not in logs.text


@pytest.mark.parametrize("racers", [2, 3])
async def test_supervisors_racing_on_one_job(slurm: SlurmLab, racers: int) -> None:
    """Each racer has its own backend (its own poller and cache: separate processes sharing only
    Slurm and the store). Each may submit a held job; the extras never run and are cancelled."""
    store = MemoryStore()
    backends: list[SlurmBackend] = [
        open_adapter(slurm.backend_config(poll_interval=0.5)) for _ in range(racers)
    ]
    name = f"race{racers}"  # a job of its own: Slurm still shows the last test's jobs (MinJobAge)
    spec = JobSpec(name=name, command=("sleep", "3"))
    try:
        await compose(backends[0], store=store).operator.submit(spec, ALICE, supervised=True)
        records = await asyncio.wait_for(
            asyncio.gather(*(Supervisor(b, store, poll_interval=1.0).run(name) for b in backends)), 120
        )
        submits = sum(b.submits for b in backends)
    finally:
        for b in backends:
            await b.aclose()
    for record in records:
        assert record.state is State.SUCCEEDED, record
        assert len(record.submissions) == 1
    canonical = str(records[0].submissions[0].canonical)
    jobs = tagged(slurm, name)
    extras = {jid: info for jid, info in jobs.items() if jid != canonical}
    assert submits <= racers  # at most one submit per racing supervisor
    assert len(extras) == submits - 1
    for info in extras.values():
        assert info["JobState"] == "CANCELLED", info
        assert info.get("RunTime") == "00:00:00", info  # held, never released: never ran
    print(f"\n{racers} racing supervisors: {submits} submits, {submits - 1} extra")


def _plan(name: str) -> Plan:
    return Plan(job=name)


async def _wait(
    backend: SlurmBackend, job: str, pred: Callable[[ObjectView], bool], within: float
) -> ObjectView:
    deadline = time.monotonic() + within
    last: ObjectView | None = None
    while time.monotonic() < deadline:
        try:
            views = await backend.list(job)
        except Exception:  # a fault injected on purpose: look again
            views = []
        if views:
            last = views[-1]
            if pred(last):
                return last
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out after {within}s waiting on {job}; last view {last}")

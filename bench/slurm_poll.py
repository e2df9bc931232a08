"""Polling cost of the Slurm bridge: REST requests per poll cycle for 1, 100 and 1,000 supervised jobs,
and slurmrestd load in steady state.

    .venv/bin/python bench/slurm_poll.py            # against an in-process fake slurmrestd
    .venv/bin/python bench/slurm_poll.py --live     # also against each real Slurm (root, make
                                                    # slurm-deps slurm-chroots): 22.05, 24.11, 26.05

Each supervised job has one object; each of its supervisors lists it once per cycle, as
Supervisor.run does when woken. Only GET /jobs may reach the server, once per cycle. Live, it also
times one listing of the (1,000+) jobs with each listing call the server offers: ``GET /jobs``,
``GET /jobs?update_time=`` when nothing changed (22.05: 304; v0.0.42+: an empty 200; 24.11's
v0.0.40/41 refuse it) and ``GET /jobs/state`` (v0.0.40+: ids and states only).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "operator")]

from dispatch import SlurmOptions  # noqa: E402
from dispatch._backends.slurm._adapter import SlurmBackend, SlurmConfig, open_adapter  # noqa: E402
from dispatch._model import JobSpec, Plan  # noqa: E402
from tests.support.fake_slurm import FakeSlurm  # noqa: E402

SIZES = (1, 100, 1000)


async def drive(b: SlurmBackend, jobs: list[str], seconds: float, interval: float) -> None:
    unsubs = [b.subscribe(j, lambda: None) for j in jobs]

    async def supervisor(job: str) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            await b.list(job)
            await asyncio.sleep(interval)

    try:
        await asyncio.gather(*(supervisor(j) for j in jobs))
    finally:
        for u in unsubs:
            u()


async def fake(seconds: float, interval: float) -> None:
    print(f"fake slurmrestd (MockTransport), poll interval {interval} s, {seconds} s per size")
    print(f"{'jobs':>6} {'requests':>9} {'cycles':>7} {'req/cycle':>10} {'304s':>5} {'req/s':>6}")
    for n in SIZES:
        server = FakeSlurm(n, foreign=50)
        cfg = SlurmConfig(
            url="http://fake", user_name="dispatch", api_version="v0.0.38", poll_interval=interval
        )
        b = SlurmBackend(cfg, transport=httpx.MockTransport(server))
        t0 = time.monotonic()
        await drive(b, [f"j{i}" for i in range(n)], seconds, interval)
        elapsed = time.monotonic() - t0
        total = sum(server.paths.values())
        print(
            f"{n:>6} {total:>9} {b.poller.cycles:>7} {total / max(b.poller.cycles, 1):>10.2f} "
            f"{server.not_modified:>5} {total / elapsed:>6.2f}"
        )
        await b.aclose()


async def listing_costs(b: SlurmBackend, repeat: int = 5) -> dict[str, float]:
    """Median wall time (ms) of one listing of every job, by listing call."""
    d = await b.dialect()
    calls: dict[str, tuple[str, dict[str, int] | None]] = {"GET /jobs": (d.jobs_path(), None)}
    if d.update_time_accepted:
        calls["GET /jobs?update_time (unchanged)"] = (d.jobs_path(), {"update_time": int(time.time()) + 3600})
    if d.lookup_path() is not None:
        calls["GET /jobs/state"] = (str(d.lookup_path()), None)
    out: dict[str, float] = {}
    for name, (path, params) in calls.items():
        times: list[float] = []
        for _ in range(repeat):
            t = time.monotonic()
            await b.rest.request("GET", path, params=params, what=name)
            times.append((time.monotonic() - t) * 1000)
        out[name] = statistics.median(times)
    return out


async def live(seconds: float, interval: float, version: str) -> None:
    from tests.support.slurmlab import SlurmLab

    print(f"\nreal Slurm {version}, poll interval {interval} s, {seconds} s per size (load: {load()})")
    head = f"{'jobs':>6} {'requests':>9} {'cycles':>7} {'req/cycle':>10} {'unchanged':>9} {'req/s':>6}"
    print(head)
    with SlurmLab(version, min_job_age=300) as lab:
        submitted = 0
        b = open_adapter(lab.backend_config(poll_interval=interval))
        for n in SIZES:
            spec = JobSpec(name="bench", command=("true",), slurm=SlurmOptions(partition="low"))
            while submitted < n:  # held jobs, each its own supervised dispatch job
                await b.create(f"b{submitted}", 1, spec, Plan(job=f"b{submitted}"))
                submitted += 1
            await b.aclose()
            b = open_adapter(lab.backend_config(poll_interval=interval))
            await b.dialect()
            await asyncio.sleep(2.5)  # let Slurm's last_job_update age, as in steady state
            before = b.rest.requests
            cycles0, nm0 = b.poller.cycles, b.poller.not_modified
            t0 = time.monotonic()
            await drive(b, [f"b{i}" for i in range(n)], seconds, interval)
            elapsed = time.monotonic() - t0
            total = b.rest.requests - before
            cycles = b.poller.cycles - cycles0
            print(
                f"{n:>6} {total:>9} {cycles:>7} {total / max(cycles, 1):>10.2f} "
                f"{b.poller.not_modified - nm0:>9} {total / elapsed:>6.2f}"
            )
        costs = await listing_costs(b)
        print(f"one listing of {submitted} jobs ({(await b.dialect()).version}):")
        for name, ms in costs.items():
            print(f"  {name:<36} {ms:>8.1f} ms")
        await b.aclose()


def load() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--live", action="store_true", help="also measure against a real Slurm lab")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--interval", type=float, default=2.0, help="poll interval (the default is 2 s)")
    ap.add_argument("--slurm", default="22.05,24.11,26.05", help="Slurm versions for --live, comma-separated")
    args = ap.parse_args()
    asyncio.run(fake(args.seconds, args.interval))
    if args.live:
        for version in args.slurm.split(","):
            asyncio.run(live(args.seconds, args.interval, version.strip()))


if __name__ == "__main__":
    main()

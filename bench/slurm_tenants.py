"""Listing cost of Slurm identities by namespace: one shared poller (the operator's token lists
every job once per cycle) against one poller per identity (each identity's token lists every job:
slurmrestd has no filter by user), for 1, 10 and 100 identities with one supervised job each.

    .venv/bin/python bench/slurm_tenants.py       # against an in-process fake slurmrestd (v0.0.38)

The fake answers every listing in full (no 304), as a busy cluster whose jobs change every cycle
does: the figures are the ceiling of both designs.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "operator")]

from dispatch._backends.slurm._adapter import SlurmBackend, SlurmConfig  # noqa: E402
from tests.support.fake_slurm import FakeSlurm  # noqa: E402

SIZES = (1, 10, 100)


class Busy(FakeSlurm):
    """One running job per identity, each owned by its user; every listing answered in full."""

    def __init__(self, identities: int) -> None:
        super().__init__(0)
        for i in range(identities):
            self.jobs[i + 1] = {**self._record(i + 1, f"ns{i}/train", "RUNNING"), "user_name": f"u{i}"}
        self.bytes = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.last_update = int(time.time()) + 10
        response = super().__call__(request)
        self.bytes += len(response.content)
        return response


def tenant(i: int) -> dict[str, Any]:
    return {"name": f"t{i}", "namespaces": [f"ns{i}"], "user_name": f"u{i}", "token": f"tok{i}"}


async def drive(backends: list[tuple[SlurmBackend, str]], seconds: float, interval: float) -> None:
    async def supervisor(b: SlurmBackend, job: str) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            await b.list(job)
            await asyncio.sleep(interval)

    await asyncio.gather(*(supervisor(b, j) for b, j in backends))


async def run(identities: int, shared: bool, seconds: float, interval: float) -> tuple[float, float]:
    server = Busy(identities)
    transport = httpx.MockTransport(server)
    base: dict[str, Any] = {"url": "http://fake", "api_version": "v0.0.38", "poll_interval": interval}
    if shared:
        one = SlurmBackend(
            SlurmConfig.model_validate(
                {**base, "user_name": "op", "token": "op", "tenants": [tenant(i) for i in range(identities)]}
            ),
            transport=transport,
        )
        backends = [(one, f"ns{i}/train") for i in range(identities)]
    else:
        backends = [
            (
                SlurmBackend(SlurmConfig(**base, user_name=f"u{i}", token=f"tok{i}"), transport=transport),
                f"ns{i}/train",
            )
            for i in range(identities)
        ]
    try:
        await drive(backends, seconds, interval)
    finally:
        for b in {id(b): b for b, _ in backends}.values():
            await b.aclose()
    cycles = seconds / interval
    return server.gets / cycles, server.bytes / cycles


async def main(seconds: float, interval: float) -> None:
    print(f"fake slurmrestd (MockTransport), poll interval {interval} s, {seconds} s per run")
    print("per cycle: per poll interval")
    print(f"{'identities':>10} {'design':>13} {'GET /jobs per cycle':>20} {'KiB per cycle':>14}")
    for n in SIZES:
        for shared in (True, False):
            per_cycle, size = await run(n, shared, seconds, interval)
            design = "shared" if shared else "per identity"
            print(f"{n:>10} {design:>13} {per_cycle:>20.2f} {size / 1024:>14.1f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--interval", type=float, default=0.5)
    args = parser.parse_args()
    # Per identity, each poller warns once of every other identity's tagged job: not the figure.
    logging.disable(logging.WARNING)
    asyncio.run(main(args.seconds, args.interval))

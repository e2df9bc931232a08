"""Polling cost: one GET /jobs per cycle whatever the number of supervised jobs.

A fake slurmrestd (httpx.MockTransport) serves N tagged jobs with Slurm 22.05's ``update_time`` rule
(304 when nothing changed since ``update_time - 1``); N supervisors each list their job every cycle.
Its job records are copies of one recorded from the real 22.05 (a running job of
``tests/unit/data/slurm/22.05/v0.0.38/jobs-running.json``) with the id, name and comment changed.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import logging
import time
from collections import Counter
from collections.abc import Callable

import httpx
import pytest

from dispatch._backends.slurm._adapter import SlurmBackend, SlurmConfig
from dispatch._model import Phase
from tests.support.fake_slurm import FakeSlurm


def counter(wakes: Counter[str], job: str) -> Callable[[], None]:
    def wake() -> None:
        wakes[job] += 1

    return wake


def make_backend(fake: FakeSlurm, interval: float) -> SlurmBackend:
    config = SlurmConfig(
        url="http://slurm.test",
        user_name="dispatch",
        token="t",
        api_version="v0.0.38",
        poll_interval=interval,
    )
    return SlurmBackend(config, transport=httpx.MockTransport(fake))


async def supervise_for(
    n: int, seconds: float, interval: float
) -> tuple[FakeSlurm, SlurmBackend, Counter[str]]:
    """n supervisors, each subscribed and listing its job once per interval (like Supervisor.run)."""
    fake = FakeSlurm(n, foreign=50)
    b = make_backend(fake, interval)
    wakes: Counter[str] = Counter()
    unsubs = [b.subscribe(f"j{i}", counter(wakes, f"j{i}")) for i in range(n)]

    async def supervisor(i: int) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            views = await b.list(f"j{i}")
            assert len(views) == 1
            await asyncio.sleep(interval)

    try:
        await asyncio.gather(*(supervisor(i) for i in range(n)))
    finally:
        for u in unsubs:
            u()
    return fake, b, wakes


@pytest.mark.parametrize("n", [1, 100, 1000])
async def test_requests_per_cycle_are_constant(n: int) -> None:
    interval = 0.1
    fake, b, _ = await supervise_for(n, 1.5, interval)
    try:
        cycles = b.poller.cycles
        assert fake.gets == cycles  # exactly one request per cycle
        assert sum(fake.paths.values()) == fake.gets  # and nothing else: no per-job request
        # ~1.5 s / 0.1 s = 15 cycles whatever n is: list() never adds a request when the cache is
        # fresh, so never 1,000 supervisors' worth. Fewer on a loaded machine (the event loop misses
        # beats): the lower bound only asks that the loop ran, it is not a timing target.
        assert 2 <= cycles <= 26, cycles
        assert fake.not_modified >= cycles - 3  # steady state: 304s
    finally:
        await b.aclose()


async def test_steady_state_rate_at_the_default_interval() -> None:
    fake = FakeSlurm(100)
    b = make_backend(fake, 2.0)
    assert b.config.poll_interval == 2.0  # the default
    b.poller.interval = 0.2  # the same loop, 10x faster, so the test takes 2 s instead of 20 s
    unsubs = [b.subscribe(f"j{i}", lambda: None) for i in range(100)]
    try:
        await asyncio.sleep(2.05)
        rate = fake.gets / 2.0 * (0.2 / 2.0)  # scaled back to the 2 s interval
        assert rate <= 0.55, rate
    finally:
        for u in unsubs:
            u()
        await b.aclose()


async def test_a_change_wakes_only_its_job() -> None:
    fake = FakeSlurm(10)
    b = make_backend(fake, 0.05)
    wakes: Counter[str] = Counter()
    unsubs = [b.subscribe(f"j{i}", counter(wakes, f"j{i}")) for i in range(10)]
    try:
        await asyncio.sleep(0.3)
        wakes.clear()
        fake.finish(3)
        for _ in range(100):
            if wakes:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)
        assert set(wakes) == {"j3"}
        [view] = await b.list("j3")
        assert view.phase is Phase.ENDED
    finally:
        for u in unsubs:
            u()
        await b.aclose()


async def test_errors_back_off() -> None:
    calls: list[float] = []

    def down(request: httpx.Request) -> httpx.Response:
        calls.append(time.monotonic())
        return httpx.Response(503, text="")

    config = SlurmConfig(url="http://slurm.test", api_version="v0.0.38", poll_interval=0.05, max_backoff=0.4)
    b = SlurmBackend(config, transport=httpx.MockTransport(down))
    unsub = b.subscribe("x", lambda: None)
    try:
        await asyncio.sleep(1.6)
        gaps = [b2 - a for a, b2 in itertools.pairwise(calls)]
        assert gaps, calls
        assert (gaps[0] >= 0.09, max(gaps) >= 0.35) == (True, True), gaps  # 0.1, 0.2, 0.4, 0.4 ...
        assert len(calls) <= 7
        # list() during backoff answers with the last error at once, without a request
        before = len(calls)
        with pytest.raises(Exception, match="HTTP 503"):
            await b.list("x")
        assert len(calls) <= before + 1
    finally:
        unsub()
        await b.aclose()


async def test_a_change_of_a_job_nobody_subscribed_to_is_told_to_the_others_hook() -> None:
    """A settled job is let go (no subscriber); a Slurm job of it that changes (one created after it
    settled) is told to ``subscribe_others`` (the operator's loop), and a subscribed job is not."""
    fake = FakeSlurm(10)
    b = make_backend(fake, 0.05)
    wakes: Counter[str] = Counter()
    others: list[str] = []
    unsubs = [b.subscribe(f"j{i}", counter(wakes, f"j{i}")) for i in range(5)]
    unsubs.append(b.subscribe_others(others.append))
    try:
        await asyncio.sleep(0.3)
        assert sorted(others) == [f"j{i}" for i in range(5, 10)]  # first seen: a change
        others.clear()
        wakes.clear()
        fake.finish(3)
        fake.finish(7)
        for _ in range(100):
            if others and wakes:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)
        assert others == ["j7"]
        assert set(wakes) == {"j3"}
        unsubs.pop()()
        fake.finish(8)
        await asyncio.sleep(0.3)
        assert others == ["j7"]  # unsubscribed
    finally:
        for u in unsubs:
            u()
        await b.aclose()


def token_for(user: str) -> str:
    """A JWT as ``scontrol token`` mints it (the signature is slurmrestd's to check)."""

    def part(obj: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")

    return f"{part({'alg': 'HS256', 'typ': 'JWT'})}.{part({'exp': 1900000000, 'sun': user})}.c2lnbmF0dXJl"


async def test_a_planted_job_with_a_copied_tag_is_never_adopted(caplog: pytest.LogCaptureFixture) -> None:
    # No user_name configured (the chart's default): the token's own user is whose jobs are ours.
    fake = FakeSlurm(1)
    planted = {**fake.jobs[1], "job_id": 1000, "user_name": "mallory"}
    fake.jobs = {999: {**fake.jobs[1], "job_id": 999}, 1000: planted}
    config = SlurmConfig(url="http://slurm.test", token=token_for("dispatch"), api_version="v0.0.38")
    b = SlurmBackend(config, transport=httpx.MockTransport(fake))
    try:
        with caplog.at_level(logging.WARNING, logger="dispatch.slurm"):
            views = await b.list("j0")
        assert [v.id for v in views] == ["999"]
        assert (
            "Slurm job 1000 carries the tag of j0 submission 1 but belongs to user 'mallory'" in caplog.text
        )
    finally:
        await b.aclose()

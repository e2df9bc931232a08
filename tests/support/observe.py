"""Waiting on a job's status through the Observer, for tests on the memory backend."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import dispatch


async def wait_for(
    observer: dispatch.Observer, job: str, ok: Callable[[dispatch.Status], bool]
) -> dispatch.Status:
    """Poll until the job's status satisfies ``ok`` (10 s at most: a hang fails, it is never timed)."""
    async with asyncio.timeout(10):
        while True:
            status = await observer.get(job)
            if ok(status):
                return status
            await asyncio.sleep(0.005)

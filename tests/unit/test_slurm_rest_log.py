"""The slurmrestd client logs each request at DEBUG: the supervisor polls every few seconds, and an
INFO line per request would bury what changed in the operator's log."""

from __future__ import annotations

import asyncio
import logging

import httpx
import pytest

from dispatch._backends.slurm._rest import RestClient


def test_each_request_is_logged_at_debug_and_nothing_at_info(caplog: pytest.LogCaptureFixture) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"jobs": [], "errors": []})

    async def one() -> None:
        client = RestClient(url="http://slurmrestd", transport=httpx.MockTransport(answer))
        try:
            await client.request("GET", "/slurm/v0.0.41/jobs", what="list jobs")
        finally:
            await client.aclose()

    caplog.set_level(logging.DEBUG)
    asyncio.run(one())
    about = [r for r in caplog.records if "/slurm/v0.0.41/jobs" in r.getMessage()]
    assert [(r.name, r.levelno) for r in about] == [("dispatch.slurm.rest", logging.DEBUG)], [
        (r.name, r.levelname, r.getMessage()) for r in about
    ]

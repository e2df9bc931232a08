"""The slurmrestd client logs each request at DEBUG: the supervisor polls every few seconds, and an
INFO line per request would bury what changed in the operator's log."""

from __future__ import annotations

import asyncio
import logging

import httpx
import pytest

from dispatch._backends.slurm._rest import RestClient, TokenSource


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


def test_a_token_cut_short_in_an_answer_is_scrubbed() -> None:
    # A proxy that echoes the request headers in its 502 body, cut after 80 characters: the
    # header and the start of the claims (the Slurm user name among them) must not reach a status.
    token = (
        "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJleHAiOjE4MDAwMDAwMDAsInN1biI6ImFkYSJ9.c2lnbmF0dXJlLXBhcnQ"
    )

    client = RestClient(url="http://slurmrestd:6820", token=TokenSource(token))
    for cut in (token[:80], token[:50], token.split(".")[1][:20]):
        scrubbed = client.scrub(f"502 Bad Gateway: X-SLURM-USER-TOKEN echoed {cut}...")
        assert cut not in scrubbed, scrubbed
        assert "eyJ" not in scrubbed, scrubbed
    asyncio.run(client.aclose())

"""A fault-injecting HTTP proxy in front of a real slurmrestd, for the live Slurm tests.

Everything passes through to the real server unless :attr:`FaultProxy.mode` says otherwise, so
the faults are the only thing not real: what a broken load balancer, a gateway or an overloaded
slurmrestd answers. Modes:

``pass``      forward (the default)
``garbage``   200 with a body that is not JSON
``empty``     the real job listing with its ``jobs`` emptied (other requests forwarded)
``truncate``  the real job listing with every other job left out
``5xx``       502 with an HTML page
``slow``      forward after ``slow_seconds`` (longer than the adapter's request timeout)
``echo``      500 with a page that echoes the request, its token header included
``stale``     the first job listing this proxy forwarded, replayed (an answer older than one read)

Runs its own event loop in a thread, so synchronous and asynchronous tests can use it alike.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
from collections import Counter
from typing import Any

import aiohttp
from aiohttp import web

MODES = ("pass", "garbage", "empty", "truncate", "5xx", "slow", "echo", "stale")


class FaultProxy:
    def __init__(
        self, upstream: str, *, slow_seconds: float = 3.0, tls: ssl.SSLContext | None = None
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.tls = tls
        """The proxy's server context: slurmrestd behind a TLS-terminating proxy, as a site runs it."""
        self.slow_seconds = slow_seconds
        self.mode = "pass"
        self.served: Counter[str] = Counter()
        """Answers given, by mode."""
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="slurm-fault-proxy", daemon=True)
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._first_listing: tuple[int, bytes, str] | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self.tls)
        await site.start()
        self.port = int(self._runner.addresses[0][1])

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _forward(self, request: web.Request) -> tuple[int, bytes, str]:
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        body = await request.read()
        async with self._session.request(
            request.method, self.upstream + request.path_qs, headers=headers, data=body or None
        ) as r:
            return r.status, await r.read(), r.headers.get("Content-Type", "application/json")

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        mode = self.mode
        listing = request.method == "GET" and request.path.rstrip("/").endswith("/jobs")
        if mode in ("empty", "truncate", "stale") and not listing:
            mode = "pass"
        self.served[mode] += 1
        if mode == "garbage":
            return web.Response(status=200, text="<<<not json at all>>>", content_type="text/plain")
        if mode == "5xx":
            return web.Response(
                status=502, text="<html><h1>502 Bad Gateway</h1></html>", content_type="text/html"
            )
        if mode == "echo":
            lines = [f"{request.method} {request.path_qs}"] + [
                f"{k}: {v}" for k, v in request.headers.items()
            ]
            return web.Response(status=500, text="\n".join(lines), content_type="text/plain")
        if mode == "slow":
            await asyncio.sleep(self.slow_seconds)
        if mode == "stale" and self._first_listing is not None:
            status, body, ctype = self._first_listing
            return web.Response(status=status, body=body, content_type=ctype.split(";")[0])
        status, body, ctype = await self._forward(request)
        if listing and status == 200 and self._first_listing is None and "update_time" not in request.query:
            self._first_listing = (status, body, ctype)
        if mode in ("empty", "truncate") and status == 200:
            data: dict[str, Any] = json.loads(body)
            jobs = data.get("jobs") or []
            data["jobs"] = [] if mode == "empty" else jobs[::2]
            body = json.dumps(data).encode()
        return web.Response(status=status, body=body, content_type=ctype.split(";")[0])

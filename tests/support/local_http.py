"""A real local HTTP server (aiohttp) for the unit tests of dispatch's own client: what it sends and
how it reads answers a real API server cannot be made to give at will (an error, a missing header).
The answers a real kube-apiserver gives are the integration tests' (docs/testing.md)."""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web


@contextlib.asynccontextmanager
async def serving(
    handle: Callable[[web.Request], Awaitable[web.StreamResponse]], *, tls: ssl.SSLContext | None = None
) -> AsyncIterator[str]:
    """A real local HTTP server answering every path with ``handle``; yields its base URL
    (``https://`` with ``tls``, the server's context)."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    finally:
        await runner.cleanup()

"""A streamed API response (a watch, or a list read with ``_preload_content=False``), let go at once.

Left before the end of its body (the task that reads it cancelled mid-read, an error, a break),
aiohttp closes such a connection the polite way: TLS sends close_notify and the socket stays open
until the API server answers it, for up to 30 s (asyncio's ssl_shutdown_timeout). A loaded API
server answers late; a socket still open when a test's event loop ends is reported unclosed
(ResourceWarning, an error under ``filterwarnings = error``) in whichever later test collects it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import aiohttp


@contextlib.asynccontextmanager
async def streamed(response: aiohttp.ClientResponse) -> AsyncIterator[aiohttp.ClientResponse]:
    """``response`` for the block, released after it; its connection aborted (closed without
    TLS's close_notify exchange, on the loop's next turn) when the block leaves before the body's
    end. A body read to its end has already given its connection back to the pool."""
    connection = response.connection
    transport = connection.transport if connection is not None else None
    async with response:
        try:
            yield response
        finally:
            if response.connection is not None and transport is not None:
                transport.abort()

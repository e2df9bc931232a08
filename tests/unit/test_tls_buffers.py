"""The operator reads TLS in 64 KiB pieces (``read_tls_in_smaller_pieces``): asyncio otherwise holds
a 256 KiB read buffer for every open connection, and a mass preemption keeps about 70 open.

Real TLS connections over loopback (asyncio on both ends), with tracemalloc counting what
asyncio's ``sslproto`` holds while they are open; and a payload of several buffers read whole."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import tracemalloc
from asyncio import sslproto
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from dispatch._controller.tls import TLS_READ_SIZE, read_tls_in_smaller_pieces
from tests.support.controlplane import loopback_tls

CONNECTIONS = 10
PAYLOAD = bytes(range(256)) * 4096  # 1 MiB


@contextlib.asynccontextmanager
async def tls_server(tmp_path: Path) -> AsyncIterator[tuple[int, ssl.SSLContext]]:
    """A TLS server that sends PAYLOAD to each client; yields its port and a client context."""
    server_ctx, ca = loopback_tls(tmp_path, "tls-buffer-ca")

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(PAYLOAD)
        await writer.drain()
        await reader.read()  # until the client closes
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=server_ctx)
    async with server:
        yield server.sockets[0].getsockname()[1], ssl.create_default_context(cafile=str(ca))


async def held_per_connection(tmp_path: Path) -> float:
    """Bytes asyncio's sslproto holds per open connection (client and server side together), with
    PAYLOAD read whole by each client first."""
    async with tls_server(tmp_path) as (port, context):
        tracemalloc.start()
        try:
            opened = [
                await asyncio.open_connection("127.0.0.1", port, ssl=context) for _ in range(CONNECTIONS)
            ]
            for reader, _ in opened:
                assert await reader.readexactly(len(PAYLOAD)) == PAYLOAD
            snapshot = tracemalloc.take_snapshot()
        finally:
            tracemalloc.stop()
        for _, writer in opened:
            writer.close()
        await asyncio.gather(*(writer.wait_closed() for _, writer in opened), return_exceptions=True)
    held = snapshot.filter_traces([tracemalloc.Filter(True, sslproto.__file__)])
    return sum(stat.size for stat in held.statistics("filename")) / CONNECTIONS


async def test_a_connection_holds_64_kib_to_read_instead_of_256(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sslproto.SSLProtocol, "max_size", sslproto.SSLProtocol.max_size)  # restored after
    default = await held_per_connection(tmp_path)
    read_tls_in_smaller_pieces()
    smaller = await held_per_connection(tmp_path)
    assert default >= 2 * 256 * 1024  # each end's buffer
    assert smaller <= 2 * TLS_READ_SIZE + 32 * 1024  # each end's buffer, and a little besides

"""tests/support/watch.py: a watch left mid-stream lets its socket go at once, not when the server
answers TLS's close_notify (the integration tier's release watch, see tests/integration/conftest.py).

The server here is a TLS socket in a thread that sends a watch's first event and then reads
nothing more: an API server too loaded to answer close_notify before the test ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import aiohttp

from tests.support.controlplane import _cert_pem, _issue, _key_pem, _make_ca
from tests.support.watch import streamed

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
EVENT = b'{"type":"ADDED","object":{}}\n'


@contextlib.contextmanager
def _silent_watch_server(tmp_path: Path) -> Iterator[tuple[int, ssl.SSLContext]]:
    """A port whose one connection gets a watch's head and first event, then silence (no read:
    the client's close_notify stays unanswered); and the client's context trusting it."""
    ca_key, ca_cert = _make_ca("watch-test-ca")
    key, cert = _issue(ca_key, ca_cert, common_name="localhost", server=True, ips=["127.0.0.1"])
    (tmp_path / "tls.crt").write_bytes(_cert_pem(cert))
    (tmp_path / "tls.key").write_bytes(_key_pem(key))
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    client_ctx = ssl.create_default_context(cadata=_cert_pem(ca_cert).decode())
    listener = socket.create_server(("127.0.0.1", 0))
    done = threading.Event()

    def serve() -> None:
        conn, _ = listener.accept()
        with server_ctx.wrap_socket(conn, server_side=True) as tls:
            tls.recv(65536)  # the request
            tls.sendall(HEAD + b"%x\r\n" % len(EVENT) + EVENT + b"\r\n")
            done.wait(30)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1], client_ctx
    finally:
        done.set()
        thread.join(10)
        listener.close()


async def test_a_watch_cancelled_mid_read_closes_its_socket_without_the_servers_answer(
    tmp_path: Path,
) -> None:
    with _silent_watch_server(tmp_path) as (port, ctx):
        async with aiohttp.ClientSession() as session:
            response = await session.get(f"https://127.0.0.1:{port}/watch", ssl=ctx)
            assert response.connection is not None
            assert response.connection.transport is not None
            sock = response.connection.transport.get_extra_info("socket")
            first = asyncio.Event()

            async def follow() -> None:
                async with streamed(response):
                    async for _ in response.content.iter_any():
                        first.set()

            task = asyncio.create_task(follow())
            await first.wait()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await asyncio.sleep(0)  # the abort closes the socket on the loop's next turn
            assert sock.fileno() == -1, "the watch's socket waits for the server's close_notify"

"""A watch or a read left mid-body lets its socket go at once, not when the server answers TLS's
close_notify: ``streamed`` itself, the Informer's watch, ``CustomObjects.watch`` and ``request``.

The server here is a TLS socket in a thread that answers a list, then sends a watch's first event
and reads nothing more: an API server too loaded to answer close_notify before the client is
closed (a stopping operator, a test's event loop ending; CI saw the socket reported unclosed).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from dispatch._kubeclient import Body, Connection, CustomObjects, Informer, KubeClient, request, streamed
from tests.support.controlplane import loopback_tls

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
EVENT = b'{"type":"ADDED","object":{"metadata":{"namespace":"ns","name":"a","resourceVersion":"2"}}}\n'
LIST = json.dumps({"metadata": {"resourceVersion": "1"}, "items": []}).encode()


@contextlib.contextmanager
def _silent_watch_server(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """A port that answers lists (keeping the connection) and gives a watch its head and first
    event, then silence (no read: the client's close_notify stays unanswered); and the CA file."""
    server_ctx, ca = loopback_tls(tmp_path, "watch-test-ca")
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.05)  # accept() wakes to see ``done`` (a close from here would not wake it)
    done = threading.Event()

    def serve(conn: socket.socket) -> None:
        with server_ctx.wrap_socket(conn, server_side=True) as tls:
            while True:
                head = tls.recv(65536)
                if not head:
                    return
                line = head.split(b"\r\n", 1)[0]
                if b"watch=true" in line:
                    tls.sendall(HEAD + b"%x\r\n" % len(EVENT) + EVENT + b"\r\n")
                    done.wait(30)
                    return
                if b"/partial" in line:  # half a body, then silence
                    tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(LIST) + LIST[:5])
                    done.wait(30)
                    return
                tls.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n" % len(LIST) + LIST
                )

    def accept() -> None:
        while not done.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            conn.settimeout(None)
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1], ca
    finally:
        done.set()
        thread.join(10)
        listener.close()


async def _cancel_mid_watch(
    watch: Callable[[asyncio.Event], Coroutine[Any, Any, None]], sockets: Callable[[], list[socket.socket]]
) -> None:
    """Run ``watch`` until it has seen the first event, cancel it, and check that every socket
    it had is closed on the loop's next turn."""
    first = asyncio.Event()
    task = asyncio.create_task(watch(first))
    async with asyncio.timeout(10):
        await first.wait()
    held = sockets()
    assert held, "the watch holds no socket"
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await asyncio.sleep(0)  # the abort closes the socket on the loop's next turn
    assert [s.fileno() for s in held] == [-1] * len(held), "a socket waits for the server's close_notify"


def _client_sockets(client: KubeClient) -> list[socket.socket]:
    protocols = []
    for session in client._sessions.values():  # the watches' and the requests', whichever exist
        connector = session.connector
        assert isinstance(connector, aiohttp.TCPConnector)
        protocols += [*connector._acquired, *(p for conns in connector._conns.values() for p, _ in conns)]
    return [p.transport.get_extra_info("socket") for p in protocols if p.transport is not None]


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[KubeClient]:
    with _silent_watch_server(tmp_path) as (port, ca):
        async with KubeClient(Connection(host=f"https://127.0.0.1:{port}", ca_file=str(ca))) as kube:
            yield kube


async def test_streamed_aborts_a_response_left_mid_read(tmp_path: Path) -> None:
    with _silent_watch_server(tmp_path) as (port, ca):
        context = ssl.create_default_context(cafile=str(ca))
        async with aiohttp.ClientSession() as session:
            response = await session.get(f"https://127.0.0.1:{port}/watch?watch=true", ssl=context)
            assert response.connection is not None
            assert response.connection.transport is not None
            sock = response.connection.transport.get_extra_info("socket")

            async def follow(first: asyncio.Event) -> None:
                async with streamed(response):
                    async for _ in response.content.iter_any():
                        first.set()

            await _cancel_mid_watch(follow, lambda: [sock])


async def test_the_informers_watch_cancelled_mid_read_closes_its_socket(client: KubeClient) -> None:
    async def follow(first: asyncio.Event) -> None:
        informer: Informer[Body] = Informer(
            client,
            "/api/v1/namespaces/ns/pods",
            label_selector="a=b",
            on_change=lambda old, new: first.set() if new is not None else None,
            what="pods",
        )
        await informer.run()

    await _cancel_mid_watch(follow, lambda: _client_sockets(client))


async def test_a_custom_object_watch_cancelled_mid_read_closes_its_socket(client: KubeClient) -> None:
    async def follow(first: asyncio.Event) -> None:
        events = CustomObjects(client).watch("ns", resource_version="1")
        try:
            async for _ in events:
                first.set()
        finally:
            await events.aclose()  # type: ignore[attr-defined]

    await _cancel_mid_watch(follow, lambda: _client_sockets(client))


async def test_a_request_cancelled_mid_body_closes_its_socket(client: KubeClient) -> None:
    async def follow(first: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        loop.call_later(0.2, first.set)  # the head is read by then; the body never ends
        await request(client, "GET", "/partial")

    await _cancel_mid_watch(follow, lambda: _client_sockets(client))

"""Smaller TLS read buffers for the operator's API connections (a production fix, set by ``main``).

asyncio's ``SSLProtocol`` allocates its ``max_size`` (256 KiB) as the read buffer of every TLS
connection and holds it while the connection is open, and each read allocates ``max_size`` again
for what it reads (``ssl``'s ``read(n)``). A mass preemption's writes keep about 70 connections
open (``REQUEST_CONNECTIONS``): about 18 MiB, most of what the burst costs the operator. The API
server's TLS records are 16 KiB at most, so reading 64 KiB at once loses nothing.

It changes a class attribute of asyncio, for the whole process: the operator's console script
calls :func:`read_tls_in_smaller_pieces` once, before its event loop starts; a library user's
process is left as it is.
"""

from __future__ import annotations

from asyncio import sslproto
from typing import Final

TLS_READ_SIZE: Final = 64 * 1024
"""What asyncio reads from a TLS connection at once: a TLS record is at most 16 KiB."""


def read_tls_in_smaller_pieces() -> None:
    """Each TLS connection's read buffer is :data:`TLS_READ_SIZE` instead of asyncio's 256 KiB.

    Only where asyncio has the attribute, and never larger than asyncio's own."""
    if getattr(sslproto.SSLProtocol, "max_size", 0) > TLS_READ_SIZE:
        sslproto.SSLProtocol.max_size = TLS_READ_SIZE

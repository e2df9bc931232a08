"""Raw JSON requests through a :class:`Client` (dispatch's own :class:`~._transport.KubeClient`, or
kubernetes_asyncio's ApiClient in tests), with dispatch's error mapping.

Generated API classes deserialize every pod into model objects and choose patch content types
by the shape of the body; the adapter wants neither. It sends and receives plain dicts through the
client's own transport (authentication, TLS, connection pool), and turns failures into dispatch's
errors: no answer, a timeout, 429 or 5xx are :class:`~dispatch.TransientBackendError`; anything
else is :class:`KubeError` (which callers turn into :class:`~dispatch.BackendError` or handle).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any, Final, Protocol

import aiohttp

from .._errors import BackendError, TransientBackendError

Body = dict[str, Any]

JSON: Final = "application/json"
MERGE_PATCH: Final = "application/merge-patch+json"
JSON_PATCH: Final = "application/json-patch+json"
DEFAULT_TIMEOUT: Final = 30.0


class KubeError(BackendError):
    """The API server answered with an error status (not a transient one)."""

    def __init__(self, method: str, path: str, status: int, reason: str, message: str) -> None:
        self.status = status
        self.reason = reason
        self.message = message
        super().__init__(f"{method} {path}: {status} {reason or ''}: {message}".replace("  ", " "))


class Client(Protocol):
    """What dispatch needs of a client: ``call_api`` (every request, :func:`open_request`), the
    ``rest_client`` whose ``request`` the metrics and the write limit wrap, and ``close``.

    :class:`~._transport.KubeClient` is the operator's; kubernetes_asyncio's ApiClient has the same
    three, so tests and benches may hand either to the same code."""

    rest_client: Any

    async def call_api(self, resource_path: str, method: str, *args: Any, **kwargs: Any) -> Any: ...

    async def close(self) -> None: ...


def _is_transient(status: int) -> bool:
    return status == 429 or status >= 500


async def open_request(
    api: Client,
    method: str,
    path: str,
    *,
    query: Mapping[str, object] | None = None,
    body: object = None,
    content_type: str = JSON,
    request_timeout: float | aiohttp.ClientTimeout | None = DEFAULT_TIMEOUT,
) -> aiohttp.ClientResponse:
    """Send a request; return the open response (status checked, body not read)."""
    params = [(k, _query_value(v)) for k, v in (query or {}).items() if v is not None]
    try:
        response: aiohttp.ClientResponse = await api.call_api(
            path,
            method,
            query_params=params,
            header_params={"Accept": JSON, "Content-Type": content_type},
            body=body,
            auth_settings=["BearerToken"],
            _preload_content=False,
            _request_timeout=request_timeout,
        )
    except (aiohttp.ClientError, TimeoutError, OSError) as error:
        raise TransientBackendError(f"{method} {path}: {type(error).__name__}: {error}") from error
    if 200 <= response.status < 300:
        return response
    try:
        async with streamed(response):
            raw = await response.read()
    except (aiohttp.ClientError, TimeoutError, OSError):
        raw = b""
    reason, message = _status_text(raw, response.reason or "")
    if _is_transient(response.status):
        raise TransientBackendError(f"{method} {path}: {response.status} {reason}: {message}")
    raise KubeError(method, path, response.status, reason, message)


async def request(
    api: Client,
    method: str,
    path: str,
    *,
    query: Mapping[str, object] | None = None,
    body: object = None,
    content_type: str = JSON,
    request_timeout: float | None = DEFAULT_TIMEOUT,
    decode: Callable[[bytes], Body] | None = None,
) -> Body:
    """Send a request and return its decoded JSON body (by ``decode``, if given: a list page's
    reader that keeps only a projection of its items)."""
    response = await open_request(
        api, method, path, query=query, body=body, content_type=content_type, request_timeout=request_timeout
    )
    try:
        async with streamed(response):  # a cancel mid-read lets the socket go at once
            raw = await response.read()
    except (aiohttp.ClientError, TimeoutError, OSError) as error:
        raise TransientBackendError(f"{method} {path}: {type(error).__name__}: {error}") from error
    if not raw:
        return {}
    if decode is not None:
        return decode(raw)
    decoded: Body = json.loads(raw)
    return decoded


@contextlib.asynccontextmanager
async def streamed(response: aiohttp.ClientResponse) -> AsyncIterator[aiohttp.ClientResponse]:
    """``response`` for the block, released after it; its connection aborted when the block
    leaves before the body's end (a watch or a read cancelled mid-body, an error, a break).

    aiohttp closes an interrupted connection the polite way: TLS sends close_notify and the socket
    stays open until the API server answers, for up to 30 s (asyncio's ssl_shutdown_timeout). A
    loaded API server answers late, and a client closed meanwhile (a stopping operator, a test's
    event loop ending) leaves the socket behind, reported unclosed when collected. An abort closes
    it on the loop's next turn. A body read to its end has already given its connection back.
    """
    connection = response.connection
    transport = connection.transport if connection is not None else None
    try:
        yield response
    finally:
        # Not "still has its connection": aiohttp's read() closes it (politely) when cancelled.
        if transport is not None and not response.content.is_eof():
            transport.abort()
            response.close()
        else:  # read to its end: its connection is back in the pool
            response.release()


def _query_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _status_text(raw: bytes, fallback: str) -> tuple[str, str]:
    try:
        status = json.loads(raw) if raw else {}
    except ValueError:
        return fallback, raw.decode("utf-8", "replace")[:512]
    if not isinstance(status, dict):
        return fallback, str(status)[:512]
    return str(status.get("reason") or fallback), str(status.get("message") or fallback)


WRITE_METHODS: Final = frozenset({"POST", "PUT", "PATCH", "DELETE"})
UNLIMITED_PATHS: Final = ("/leases/",)
"""Writes the limit never holds back: the Lease's renewals (a throttled renewal could lose the Lease
and stop the operator, which would help nobody)."""
DEFAULT_WRITE_QPS: Final = 50.0
DEFAULT_WRITE_BURST: Final = 100
"""Kueue's defaults for its controller's client (``clientConnection.qps``/``burst``): the limit
where the API server has no Priority and Fairness of its own (:func:`server_sheds_load`)."""
FAIRNESS_HEADER: Final = "X-Kubernetes-PF-FlowSchema-UID"
"""Named in every answer of an API server whose Priority and Fairness classified the request
(k8s.io/apiserver's filter sets it, exempt requests included)."""


async def server_sheds_load(api: Client) -> bool:
    """Whether the API server protects itself by API Priority and Fairness (on by default since
    Kubernetes 1.20, GA in 1.29): it queues each client's requests in its own flows, bounded by
    seats, and answers 429 when a queue is full, which a client retries like any transient error.

    Where it does, a client-side token bucket only delays the requests the server would have
    served: SIG API Machinery advises turning it off, and controller-runtime does since v0.21.
    One GET of ``/version`` (readable by every authenticated user) and a look at its headers.
    Raises :class:`~dispatch.BackendError` (:class:`~dispatch.TransientBackendError` when the
    server does not answer).
    """
    response = await open_request(api, "GET", "/version")
    async with streamed(response):
        await response.read()
    return FAIRNESS_HEADER in response.headers


_URGENT: contextvars.ContextVar[bool] = contextvars.ContextVar("dispatch_write_urgent", default=False)


@contextlib.contextmanager
def urgent(flag: bool = True) -> Iterator[None]:
    """Writes sent inside the block (and in tasks created there) are urgent: a recovery's.

    A context variable rather than an argument, so the adapters' and the store's requests need not
    know about priorities: the supervision loop marks the step, the limiter reads the mark.
    """
    token = _URGENT.set(flag)
    try:
        yield
    finally:
        _URGENT.reset(token)


def is_urgent() -> bool:
    return _URGENT.get()


class WriteLimiter:
    """A token bucket for writes, with two lanes: urgent waiters get tokens before routine ones.

    ``qps`` tokens a second, at most ``burst`` saved up. A write takes one token, or waits in its
    lane (FIFO) until one is made. So a mass preemption's thousand recoveries go out at ``qps``
    after the first ``burst``, instead of a thousand requests at once, and the observe writes and
    Events queued behind them never delay the next recovery's write.
    """

    def __init__(self, qps: float, burst: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError(f"a write limit needs qps > 0 and burst >= 1, not {qps:g}/{burst}")
        self.qps = qps
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._stamp = clock()
        self._lanes: tuple[deque[asyncio.Future[None]], deque[asyncio.Future[None]]] = (deque(), deque())
        self._timer: asyncio.TimerHandle | None = None
        self.granted = 0
        self.waited = 0
        """Writes that had to wait for a token (throttled)."""

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._stamp) * self.qps)
        self._stamp = now

    def _waiting(self) -> bool:
        for lane in self._lanes:
            while lane and lane[0].done():  # cancelled while waiting
                lane.popleft()
        return any(self._lanes)

    async def acquire(self, urgent: bool | None = None) -> None:
        """Take a token, waiting for one if none is left (urgent first, then routine, each FIFO)."""
        self._refill()
        if self._tokens >= 1 and not self._waiting():
            self._tokens -= 1
            self.granted += 1
            return
        self.waited += 1
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._lanes[0 if (is_urgent() if urgent is None else urgent) else 1].append(future)
        self._schedule()
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self._tokens += 1  # granted as we were cancelled: give it to the next waiter
                self._grant()
            raise

    def _schedule(self) -> None:
        if self._timer is not None or not self._waiting():
            return
        delay = max((1 - self._tokens) / self.qps, 0.0)
        self._timer = asyncio.get_running_loop().call_later(delay, self._tick)

    def _tick(self) -> None:
        self._timer = None
        self._grant()

    def _grant(self) -> None:
        self._refill()
        for lane in self._lanes:
            while lane and self._tokens >= 1:
                future = lane.popleft()
                if future.done():
                    continue
                self._tokens -= 1
                self.granted += 1
                future.set_result(None)
        self._schedule()


def limit_writes(api: Client, limiter: WriteLimiter) -> Client:
    """Make every write ``api`` sends (POST, PUT, PATCH, DELETE; not the Lease's) take a token first.

    Wraps ``api.rest_client.request``, the one method all of the client's calls go through (the
    generated APIs, ``call_api``, watches), like the metrics' instrumentation; returns ``api``.
    """
    rest: Any = api.rest_client
    if getattr(rest, "_dispatch_limiter", None) is limiter:
        return api
    inner = rest.request

    async def request(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        if method.upper() in WRITE_METHODS and not any(p in url for p in UNLIMITED_PATHS):
            await limiter.acquire()
        return await inner(method, url, *args, **kwargs)

    rest.request = request
    rest._dispatch_limiter = limiter
    return api


__all__ = [
    "DEFAULT_WRITE_BURST",
    "DEFAULT_WRITE_QPS",
    "FAIRNESS_HEADER",
    "JSON",
    "JSON_PATCH",
    "MERGE_PATCH",
    "Body",
    "Client",
    "KubeError",
    "WriteLimiter",
    "is_urgent",
    "limit_writes",
    "open_request",
    "request",
    "server_sheds_load",
    "streamed",
    "urgent",
]

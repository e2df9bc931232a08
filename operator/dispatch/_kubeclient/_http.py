"""Raw JSON requests through a ``kubernetes_asyncio`` ApiClient, with dispatch's error mapping.

The generated API classes deserialize every pod into model objects and choose patch content types
by the shape of the body; the adapter wants neither. It sends and receives plain dicts through the
client's own transport (authentication, TLS, connection pool), and turns failures into dispatch's
errors: no answer, a timeout, 429 or 5xx are :class:`~dispatch.TransientBackendError`; anything
else is :class:`KubeError` (which callers turn into :class:`~dispatch.BackendError` or handle).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

import aiohttp
from kubernetes_asyncio.client import ApiClient

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


def _is_transient(status: int) -> bool:
    return status == 429 or status >= 500


async def open_request(
    api: ApiClient,
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
        raw = await response.read()
    except (aiohttp.ClientError, TimeoutError, OSError):
        raw = b""
    finally:
        response.release()
    reason, message = _status_text(raw, response.reason or "")
    if _is_transient(response.status):
        raise TransientBackendError(f"{method} {path}: {response.status} {reason}: {message}")
    raise KubeError(method, path, response.status, reason, message)


async def request(
    api: ApiClient,
    method: str,
    path: str,
    *,
    query: Mapping[str, object] | None = None,
    body: object = None,
    content_type: str = JSON,
    request_timeout: float | None = DEFAULT_TIMEOUT,
) -> Body:
    """Send a request and return its decoded JSON body."""
    response = await open_request(
        api, method, path, query=query, body=body, content_type=content_type, request_timeout=request_timeout
    )
    try:
        raw = await response.read()
    except (aiohttp.ClientError, TimeoutError, OSError) as error:
        raise TransientBackendError(f"{method} {path}: {type(error).__name__}: {error}") from error
    finally:
        response.release()
    if not raw:
        return {}
    decoded: Body = json.loads(raw)
    return decoded


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


__all__ = ["JSON", "JSON_PATCH", "MERGE_PATCH", "Body", "KubeError", "open_request", "request"]

"""Who may read ``/metrics``: the API server decides, as for any Kubernetes endpoint.

With ``--metrics-auth=kubernetes`` the metrics server answers only a request that carries a bearer
token which the API server authenticates (a TokenReview) and authorizes for ``get`` on the
non-resource URL ``/metrics`` (a SubjectAccessReview): the filter Kueue's controller-runtime
metrics server applies. Prometheus scrapes with its ServiceAccount's token, bound to a ClusterRole
that allows that URL (the chart's ``<release>-metrics-reader``). The server speaks TLS then (the
token must not cross the network in the clear): a certificate from ``--metrics-cert-dir``
(``tls.crt``, ``tls.key``) or, without one, a CA and a certificate generated at start.

=============================  ====================================================
no ``Authorization: Bearer``   401
the token is not authenticated 401
authenticated, not authorized  403
the API server cannot answer   503 (never cached: the next scrape asks again)
=============================  ====================================================

Answers are cached per token (its SHA-256, never the token) for ``ttl`` seconds, so a scrape every
few seconds costs the API server two reviews a minute per scraper.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import ssl
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from .._kubeclient import Client, request

log = logging.getLogger("dispatch.operator.metrics")

METRICS_PATH: Final = "/metrics"
TOKEN_REVIEWS: Final = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS: Final = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
OK: Final = 200
UNAUTHENTICATED: Final = 401
FORBIDDEN: Final = 403
UNAVAILABLE: Final = 503
MAX_CACHED: Final = 1024
"""More distinct tokens than scrapers exist: past it the cache starts anew (a flood of invented
tokens cannot grow it)."""


class KubernetesAuthorizer:
    """Decides a request's ``Authorization`` header by TokenReview and SubjectAccessReview.

    Called from the metrics server's threads; the reviews run on the operator's event loop with
    its API client (``loop``, ``api``).
    """

    def __init__(
        self,
        api: Client,
        loop: asyncio.AbstractEventLoop,
        *,
        ttl: float = 60.0,
        timeout: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = api
        self._loop = loop
        self._ttl = ttl
        self._timeout = timeout
        self._clock = clock
        self._cache: dict[str, tuple[float, int]] = {}

    def __call__(self, authorization: str | None) -> int:
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return UNAUTHENTICATED
        key = hashlib.sha256(token.encode()).hexdigest()
        now = self._clock()
        cached = self._cache.get(key)
        if cached is not None and cached[0] > now:
            return cached[1]
        future = asyncio.run_coroutine_threadsafe(self.review(token), self._loop)
        try:
            status = future.result(self._timeout)
        except Exception as error:  # the API server's trouble is not the scraper's answer
            future.cancel()
            log.warning("metrics: cannot review a scrape's token: %s: %s", type(error).__name__, error)
            return UNAVAILABLE
        if len(self._cache) >= MAX_CACHED:
            self._cache.clear()
        self._cache[key] = (now + self._ttl, status)
        return status

    async def review(self, token: str) -> int:
        """401, 403 or 200 for ``token``, from the API server."""
        review = await request(
            self._api,
            "POST",
            TOKEN_REVIEWS,
            body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}},
        )
        status = review.get("status") or {} if isinstance(review, dict) else {}
        if not status.get("authenticated"):
            return UNAUTHENTICATED
        user = status.get("user") or {}
        spec: dict[str, object] = {
            "user": user.get("username", ""),
            "groups": user.get("groups") or [],
            "nonResourceAttributes": {"path": METRICS_PATH, "verb": "get"},
        }
        if user.get("uid"):
            spec["uid"] = user["uid"]
        if user.get("extra"):
            spec["extra"] = user["extra"]
        access = await request(
            self._api,
            "POST",
            ACCESS_REVIEWS,
            body={"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec},
        )
        allowed = isinstance(access, dict) and bool((access.get("status") or {}).get("allowed"))
        return OK if allowed else FORBIDDEN


def server_tls(cert_dir: Path | None, hostnames: list[str]) -> ssl.SSLContext:
    """The metrics server's TLS: ``cert_dir``'s ``tls.crt``/``tls.key``, or a certificate made now."""
    if cert_dir is None:
        from .webhook import generate_certificates

        cert_dir = Path(tempfile.mkdtemp(prefix="dispatch-metrics-"))
        generate_certificates(cert_dir, hostnames)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_dir / "tls.crt", cert_dir / "tls.key")
    return context

"""A small slurmrestd client: one httpx.AsyncClient, auth headers, timeouts, error mapping.

Every failure that may pass (timeouts, refused connections, HTTP 5xx without a definite Slurm
answer, malformed JSON, a rejected or expired token) becomes a
:class:`~dispatch._errors.TransientBackendError`; a definite refusal by Slurm (an ``ESLURM_*``
error number) becomes a :class:`SlurmApiError`. No message ever contains the token: every message
built here goes through :meth:`RestClient.scrub`, which also removes anything shaped like a JWT
(an echoing proxy may show a token this process no longer holds).
"""

from __future__ import annotations

import base64
import json
import logging
import re
import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
from pydantic import SecretStr

from ..._config import RereadFile
from ..._constants import JWT_FRAGMENT
from ..._errors import BackendError, TransientBackendError

log = logging.getLogger("dispatch.slurm.rest")

# Slurm error numbers (slurm_errno.h) the adapter reads.
ESLURM_INVALID_JOB_ID = 2017
ESLURM_ALREADY_DONE = 2021
ESLURM_JOB_HELD = 2042
ESLURM_REQUESTED_PART_CONFIG_UNAVAILABLE = 2015
ESLURM_JOB_FINISHED = 2044
ESLURM_ACCESS_DENIED = 2002
ESLURM_INVALID_PARTITION_NAME = 2000
SLURM_PROTOCOL_AUTHENTICATION_ERROR = 1007
AUTH_ERRORS = frozenset({SLURM_PROTOCOL_AUTHENTICATION_ERROR, *range(6000, 6100)})
"""Slurm's authentication errors: SLURM_PROTOCOL_AUTHENTICATION_ERROR and the ESLURM_AUTH_* range."""
AUTH_STATUSES = frozenset({401, 403, 511})
"""HTTP statuses slurmrestd answers a missing, rejected or expired token with (24.11+: 511 + 1007)."""
TOKEN_REJECTED = "token rejected or expired (check the token and that it belongs to the user name)"

_JWT = re.compile(JWT_FRAGMENT)
"""Anything shaped like a JWT (header.payload.signature, base64url, header starting '{"')."""


class AuthenticationError(TransientBackendError):
    """slurmrestd or slurmctld refused the credentials. Transient: a rotated token file fixes it."""


class SlurmApiError(BackendError):
    """Slurm answered, and the answer is no (a definite ``ESLURM_*`` error)."""

    def __init__(self, message: str, numbers: frozenset[int]) -> None:
        self.numbers = numbers
        super().__init__(message)


class PathNotServed(SlurmApiError):
    """HTTP 404: slurmrestd does not serve this path (e.g. an API version it does not load)."""


@dataclass(frozen=True, slots=True)
class RestResponse:
    status: int
    body: dict[str, Any] = field(default_factory=dict)

    @property
    def errors(self) -> list[dict[str, Any]]:
        errs = self.body.get("errors") or []
        return [e for e in errs if isinstance(e, dict)] if isinstance(errs, list) else []

    @property
    def error_numbers(self) -> frozenset[int]:
        """Slurm calls the key ``error_number`` in some answers and ``error_code`` in others."""
        out: set[int] = set()
        for e in self.errors:
            for key in ("error_number", "error_code"):
                v = e.get(key)
                if isinstance(v, int) and not isinstance(v, bool):
                    out.add(v)
        return frozenset(out)

    def error_text(self) -> str:
        parts = []
        for e in self.errors:
            num = e.get("error_number", e.get("error_code"))
            text = "; ".join(str(e[k]) for k in ("error", "description") if e.get(k))
            parts.append(f"[{num}] {text}" if num is not None else text)
        return " / ".join(parts) or "no error detail"


class TokenSource:
    """A JWT from configuration, or from a file (a mounted Secret) re-read when its mtime changes."""

    def __init__(self, token: SecretStr | str | None = None, token_file: str | None = None) -> None:
        raw = token.get_secret_value() if isinstance(token, SecretStr) else token
        self._static = _clean(raw) if raw is not None else None
        self._file = RereadFile(token_file) if token_file is not None else None

    @property
    def configured(self) -> bool:
        return self._static is not None or self._file is not None

    def get(self) -> str | None:
        if self._file is None:
            return self._static
        try:
            return _clean(self._file.read())
        except OSError as e:
            raise TransientBackendError(
                f"slurm token file {self._file.path} unreadable: {e.strerror}"
            ) from None

    def user(self) -> str | None:
        """The Slurm user the token was minted for (its ``sun`` claim, as ``scontrol token`` writes
        it), or None. Read without checking the signature: slurmrestd checks it on every request."""
        try:
            tok = self.get()
        except TransientBackendError:
            return None
        parts = (tok or "").split(".")
        if len(parts) != 3:
            return None
        try:
            claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
        except (ValueError, TypeError):
            return None
        user = claims.get("sun") if isinstance(claims, dict) else None
        return user if isinstance(user, str) and user else None

    def secrets(self) -> list[str]:
        """Every form of the token that must never be shown (the token, its signature)."""
        try:
            tok = self.get()
        except TransientBackendError:
            last = self._file.last if self._file is not None else None
            tok = _clean(last) if last is not None else None
        if not tok:
            return []
        out = [tok]
        sig = tok.rsplit(".", 1)[-1]
        if len(sig) >= 8:
            out.append(sig)
        return out


def _clean(raw: str) -> str:
    """A token as files and variables carry it: ``SLURM_JWT=`` prefix, surrounding whitespace, newlines."""
    raw = raw.strip()
    if raw.startswith("SLURM_JWT="):
        raw = raw.split("=", 1)[1]
    return "".join(raw.split())


class RestClient:
    """slurmrestd over TCP (``url``) or a unix socket (``socket``)."""

    def __init__(
        self,
        *,
        url: str | None = None,
        socket: str | None = None,
        user_name: str | None = None,
        token: TokenSource | None = None,
        timeout: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
        ca_file: str | None = None,
    ) -> None:
        if transport is None and socket is not None:
            transport = httpx.AsyncHTTPTransport(uds=socket)
        # https:// checks slurmrestd's certificate and name: against ca_file when given (a site's
        # private CA), else the system's trust store. No setting turns the check off.
        verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=ca_file) if ca_file else True
        base = url if url is not None else "http://slurmrestd"
        # httpx logs every request at INFO: one line per poll, per job, in the operator's log. This
        # client logs each at DEBUG itself (``dispatch.slurm.rest``), so INFO says what changed.
        logging.getLogger("httpx").setLevel(logging.WARNING)
        self._client = httpx.AsyncClient(
            base_url=base,
            transport=transport,
            timeout=httpx.Timeout(timeout),
            follow_redirects=False,
            verify=verify,
        )
        self.user_name = user_name
        self.token = token or TokenSource()
        self.timeout = timeout
        self.requests = 0
        """How many HTTP requests this client has sent (for the polling-cost figures)."""

    async def aclose(self) -> None:
        await self._client.aclose()

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        tok = self.token.get()
        if self.user_name:
            headers["X-SLURM-USER-NAME"] = self.user_name
        if tok:
            # Only this header: every slurmrestd from 22.05 to 26.05 takes it, and 24.11+ refuse it
            # together with ``Authorization`` (401, "mutually exclusive headers").
            headers["X-SLURM-USER-TOKEN"] = tok
        return headers

    def scrub(self, text: str) -> str:
        """Remove the token from any text that may reach a log, a status or an event."""
        for secret in self.token.secrets():
            text = text.replace(secret, "***")
        return _JWT.sub("***", text)

    async def request(
        self,
        method: str,
        path: str,
        *,
        what: str,
        params: Mapping[str, str | int] | None = None,
        body: Mapping[str, Any] | None = None,
        accept: Iterable[int] = (),
    ) -> RestResponse:
        """Send one request; return the answer if it is a success or carries an ``accept``ed error.

        ``what`` names the operation in error messages (e.g. ``"cancel job 12"``).
        """
        accepted = frozenset(accept)
        try:
            headers = self._headers()
            self.requests += 1
            resp = await self._client.request(
                method, path, params=dict(params) if params else None, json=body, headers=headers
            )
        except httpx.TimeoutException:
            raise TransientBackendError(
                f"slurmrestd: {what}: no answer within {self.timeout:g} s ({method} {path})"
            ) from None
        except httpx.TransportError as e:
            raise TransientBackendError(
                self.scrub(f"slurmrestd: {what}: cannot connect ({type(e).__name__}: {e})")
            ) from None
        log.debug("%s %s: HTTP %d", method, path, resp.status_code)
        if resp.status_code == 304:
            return RestResponse(304)
        if resp.status_code in AUTH_STATUSES:
            raise AuthenticationError(
                self.scrub(f"slurmrestd: {what}: HTTP {resp.status_code}, {TOKEN_REJECTED}")
            )
        parsed = self._parse(resp, what, method, path)
        out = RestResponse(resp.status_code, parsed)
        if resp.status_code == 404 and not out.error_numbers:
            raise PathNotServed(f"slurmrestd: {what}: HTTP 404, {method} {path} is not served", frozenset())
        if 200 <= resp.status_code < 300 and not (out.error_numbers - accepted - {0}):
            return out
        if out.error_numbers & accepted:
            return out
        raise self._error(out, what, method, path)

    def _parse(self, resp: httpx.Response, what: str, method: str, path: str) -> dict[str, Any]:
        text = resp.text
        if not text.strip():
            if 200 <= resp.status_code < 300:
                return {}
            if resp.status_code == 404:
                raise PathNotServed(
                    f"slurmrestd: {what}: HTTP 404, {method} {path} is not served", frozenset()
                )
            raise TransientBackendError(f"slurmrestd: {what}: HTTP {resp.status_code} with an empty body")
        try:
            data = json.loads(text)
        except ValueError:
            if resp.status_code == 404:
                raise PathNotServed(
                    f"slurmrestd: {what}: HTTP 404, {method} {path} is not served", frozenset()
                ) from None
            snippet = self.scrub(text[:120]).replace("\n", " ")
            raise TransientBackendError(
                self.scrub(
                    f"slurmrestd: {what}: HTTP {resp.status_code}, body is not JSON "
                    f"({method} {path}): {snippet!r}"
                )
            ) from None
        if not isinstance(data, dict):
            raise TransientBackendError(
                f"slurmrestd: {what}: HTTP {resp.status_code}, expected a JSON object, "
                f"got {type(data).__name__}"
            )
        return data

    def _error(self, out: RestResponse, what: str, method: str, path: str) -> BackendError:
        detail = self.scrub(out.error_text())
        nums = out.error_numbers
        if nums & AUTH_ERRORS:
            return AuthenticationError(
                self.scrub(f"slurmrestd: {what}: HTTP {out.status}, {TOKEN_REJECTED}: {detail}")
            )
        definite = {n for n in nums if 2000 <= n < 3000 or 9000 <= n < 10000}
        if definite:
            return SlurmApiError(
                self.scrub(f"slurmrestd: {what}: Slurm refused (HTTP {out.status}): {detail}"),
                frozenset(nums),
            )
        if out.status >= 500 and -1 in nums:
            # Slurm 22.05 answers a rejected or expired token with 500 and error -1 ("unable to
            # load"), exactly as it answers when slurmctld does not answer it.
            return AuthenticationError(
                self.scrub(
                    f"slurmrestd: {what}: HTTP {out.status}: {detail} (slurmctld did not answer, or the "
                    f"{TOKEN_REJECTED}: Slurm 22.05 says both this way)"
                )
            )
        if out.status >= 500 or not 400 <= out.status < 500:
            return TransientBackendError(self.scrub(f"slurmrestd: {what}: HTTP {out.status}: {detail}"))
        return SlurmApiError(self.scrub(f"slurmrestd: {what}: HTTP {out.status}: {detail}"), frozenset(nums))

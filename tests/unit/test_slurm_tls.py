"""slurmrestd over https://: the token goes only to a server whose certificate the configured CA
(``SlurmConfig.ca_file``) or the system's trust store vouches for. A real local TLS server."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp import web
from pydantic import SecretStr, ValidationError

from dispatch._backends.slurm import SlurmConfig
from dispatch._backends.slurm._adapter import SlurmBackend
from dispatch._errors import TransientBackendError
from tests.support.controlplane import loopback_tls
from tests.support.local_http import serving

PING = "/slurm/v0.0.40/ping"


async def test_https_with_the_sites_ca_reaches_slurmrestd_and_sends_the_token(tmp_path: Path) -> None:
    server_tls, ca = loopback_tls(tmp_path, "slurm-site-ca")
    seen: list[str] = []

    async def answer(request: web.Request) -> web.Response:
        seen.append(request.headers.get("X-SLURM-USER-TOKEN", ""))
        return web.json_response({"pings": [], "errors": []})

    async with serving(answer, tls=server_tls) as url:
        config = SlurmConfig(url=url, ca_file=str(ca), token=SecretStr("tok"), user_name="u")
        backend = SlurmBackend(config)
        try:
            out = await backend.rest.request("GET", PING, what="ping")
        finally:
            await backend.aclose()
    assert out.status == 200
    assert seen == ["tok"]


async def test_https_without_the_ca_refuses_the_server_and_sends_nothing(tmp_path: Path) -> None:
    server_tls, _ca = loopback_tls(tmp_path, "slurm-site-ca")
    seen: list[str] = []

    async def answer(request: web.Request) -> web.Response:
        seen.append(request.headers.get("X-SLURM-USER-TOKEN", ""))
        return web.json_response({})

    async with serving(answer, tls=server_tls) as url:
        backend = SlurmBackend(SlurmConfig(url=url, token=SecretStr("tok"), user_name="u"))
        try:
            with pytest.raises(TransientBackendError, match="CERTIFICATE_VERIFY_FAILED"):
                await backend.rest.request("GET", PING, what="ping")
        finally:
            await backend.aclose()
    assert seen == [], "the token never left for a server the trust store does not vouch for"


@pytest.mark.parametrize("where", [{"url": "http://slurmrestd:6820"}, {"socket": "/run/slurmrestd.sock"}])
def test_ca_file_is_only_for_https(where: dict[str, str]) -> None:
    with pytest.raises(ValidationError, match="'ca_file' is for an https:// url"):
        SlurmConfig(ca_file="/etc/ca.pem", **where)

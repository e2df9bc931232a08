"""dispatch's own kubeconfig loader and client (no kubernetes_asyncio): what a kubeconfig may hold,
in-cluster from the environment and the service-account files, and the requests it sends to a real
local HTTP server (headers, token rotation, query, body)."""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from dispatch import ConfigError
from dispatch._kubeclient import _transport, open_request, request
from dispatch._kubeclient._transport import (
    Connection,
    KubeClient,
    load_in_cluster,
    load_kubeconfig,
)
from tests.support.local_http import serving


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A real self-signed certificate and key (openssl), so ``ssl`` loads them for real."""
    directory = tmp_path_factory.mktemp("tls")
    cert, key = directory / "client.crt", directory / "client.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=test",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def _write(path: Path, cluster: dict[str, Any], user: dict[str, Any], **extra: Any) -> Path:
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "main",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "main", "context": {"cluster": "c", "user": "u", "namespace": "ns"}}],
        **extra,
    }
    path.write_text(yaml.safe_dump(document))
    return path


def test_client_certificate_and_ca_as_data(tmp_path: Path, certificate: tuple[Path, Path]) -> None:
    cert, key = certificate
    data = {
        "certificate-authority-data": base64.b64encode(cert.read_bytes()).decode(),
        "server": "https://127.0.0.1:6443/",
    }
    user = {
        "client-certificate-data": base64.b64encode(cert.read_bytes()).decode(),
        "client-key-data": base64.b64encode(key.read_bytes()).decode(),
    }
    connection = load_kubeconfig(str(_write(tmp_path / "config", data, user)))
    assert connection.host == "https://127.0.0.1:6443"
    assert connection.namespace == "ns"
    assert connection.cert_file
    assert Path(connection.cert_file).read_bytes() == cert.read_bytes()
    assert connection.key_file
    assert Path(connection.key_file).read_bytes() == key.read_bytes()
    assert connection.ca_file
    assert Path(connection.ca_file).read_bytes() == cert.read_bytes()
    assert os.stat(connection.key_file).st_mode & 0o077 == 0  # the key is private
    connection.ssl_context()  # loads the chain for real
    assert connection.authorization() is None


def test_inline_material_is_removed_when_the_process_exits(
    tmp_path: Path, certificate: tuple[Path, Path]
) -> None:
    # A client key written to /tmp for ssl must not outlive the operator or the plugin.
    cert, key = certificate
    cluster = {"server": "https://127.0.0.1:6443", "certificate-authority-data": _b64(cert)}
    user = {"client-certificate-data": _b64(cert), "client-key-data": _b64(key)}
    config = _write(tmp_path / "config", cluster, user)
    code = (
        "import sys\n"
        "from dispatch._kubeclient._transport import load_kubeconfig\n"
        "c = load_kubeconfig(sys.argv[1])\n"
        "print(c.ca_file, c.cert_file, c.key_file)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(config)], capture_output=True, text=True, check=True
    )
    written = out.stdout.split()
    assert len(written) == 3
    assert [p for p in written if os.path.exists(p)] == []


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def test_files_relative_to_the_kubeconfig_and_a_token(tmp_path: Path, certificate: tuple[Path, Path]) -> None:
    cert, key = certificate
    (tmp_path / "pki").mkdir()
    (tmp_path / "pki" / "c.crt").write_bytes(cert.read_bytes())
    (tmp_path / "pki" / "c.key").write_bytes(key.read_bytes())
    cluster = {"server": "https://k:6443", "certificate-authority": "pki/c.crt", "tls-server-name": "kube"}
    user = {"client-certificate": "pki/c.crt", "client-key": "pki/c.key", "token": "abc"}
    connection = load_kubeconfig(str(_write(tmp_path / "config", cluster, user)))
    assert connection.ca_file == str(tmp_path / "pki" / "c.crt")
    assert connection.key_file == str(tmp_path / "pki" / "c.key")
    assert connection.tls_server_name == "kube"
    assert connection.authorization() == "Bearer abc"
    connection.ssl_context()


def test_insecure_and_a_named_context(tmp_path: Path) -> None:
    other = {"name": "other", "context": {"cluster": "c2", "user": "u"}}
    clusters = {
        "clusters": [{"name": "c2", "cluster": {"server": "https://x", "insecure-skip-tls-verify": True}}]
    }
    path = _write(tmp_path / "a", {"server": "https://y"}, {"token": "t"})
    document = yaml.safe_load(path.read_text())
    document["contexts"].append(other)
    document["clusters"] += clusters["clusters"]
    path.write_text(yaml.safe_dump(document))
    connection = load_kubeconfig(str(path), context="other")
    assert connection.host == "https://x"
    assert connection.insecure
    assert connection.ssl_context().check_hostname is False
    assert "context other" in connection.source


@pytest.mark.parametrize(
    ("cluster", "user", "words"),
    [
        ({}, {"token": "t"}, ["cluster 'c'", "no server"]),
        ({"server": "https://x"}, {"client-certificate": "missing.crt", "client-key": "k"}, ["missing.crt"]),
        ({"server": "https://x"}, {"client-certificate-data": "bm9wZQ=="}, ["client-key", "go together"]),
        ({"server": "https://x"}, {"client-key-data": "***"}, ["client-key-data", "base64"]),
        ({"server": "https://x"}, {"exec": {"command": "aws"}}, ["'exec'", "does not support"]),
        ({"server": "https://x", "certificate-authority": "ca.pem"}, {}, ["certificate-authority", "ca.pem"]),
    ],
)
def test_a_bad_field_is_named(
    tmp_path: Path, cluster: dict[str, Any], user: dict[str, Any], words: list[str]
) -> None:
    path = _write(tmp_path / "config", cluster, user)
    with pytest.raises(ConfigError) as raised:
        load_kubeconfig(str(path))
    for word in words:
        assert word in str(raised.value)
    assert str(path) in str(raised.value)


def test_no_context_and_a_missing_file(tmp_path: Path) -> None:
    path = _write(tmp_path / "config", {"server": "https://x"}, {}, **{"current-context": ""})
    with pytest.raises(ConfigError, match="no current-context"):
        load_kubeconfig(str(path))
    with pytest.raises(ConfigError, match="no context named 'nope'"):
        load_kubeconfig(str(path), context="nope")
    with pytest.raises(ConfigError, match="missing"):
        load_kubeconfig(str(tmp_path / "missing"))


def test_in_cluster_from_the_environment_and_files(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("one\n")
    (tmp_path / "ca.crt").write_text("x")
    (tmp_path / "namespace").write_text("dispatch-system")
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    connection = load_in_cluster(directory=str(tmp_path), environ=env)
    assert connection.host == "https://10.0.0.1:443"
    assert connection.ca_file == str(tmp_path / "ca.crt")
    assert connection.namespace == "dispatch-system"
    assert connection.authorization() == "Bearer one"
    (tmp_path / "token").write_text("two\n")  # the kubelet rotates the projected token
    os.utime(tmp_path / "token", ns=(1, os.stat(tmp_path / "token").st_mtime_ns + 10**9))
    assert connection.authorization() == "Bearer two"
    with pytest.raises(ConfigError, match="KUBERNETES_SERVICE_PORT"):
        load_in_cluster(directory=str(tmp_path), environ={"KUBERNETES_SERVICE_HOST": "h"})
    (tmp_path / "ca.crt").unlink()
    with pytest.raises(ConfigError, match=r"ca\.crt does not exist"):
        load_in_cluster(directory=str(tmp_path), environ=env)


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, list[web.Request], list[bytes]]]:
    """A real local HTTP server that records what it got and answers like the API server."""
    seen: list[web.Request] = []
    bodies: list[bytes] = []

    async def handle(req: web.Request) -> web.Response:
        seen.append(req)
        bodies.append(await req.read())
        if req.path.endswith("/missing"):
            return web.json_response({"reason": "NotFound", "message": "no such thing"}, status=404)
        return web.json_response({"ok": True})

    async with serving(handle) as host:
        yield host, seen, bodies


async def test_requests_carry_the_user_agent_token_query_and_body(
    server: tuple[str, list[web.Request], list[bytes]],
) -> None:
    from dispatch._kubeclient import KubeError

    host, seen, bodies = server
    async with KubeClient(Connection(host=host, token="tok"), user_agent="dispatch/9") as client:
        got = await request(
            client,
            "PATCH",
            "/apis/g/v1/namespaces/a/things/b",
            query={"labelSelector": "x=y,z", "watch": True},
            body={"spec": {"n": 1}},
            content_type="application/merge-patch+json",
        )
        assert got == {"ok": True}
        with pytest.raises(KubeError, match="no such thing") as raised:
            await open_request(client, "GET", "/api/v1/missing")
        assert raised.value.status == 404
        assert client.session().trust_env is False  # no ~/.netrc lookup in a thread per request
    req = seen[0]
    assert req.method == "PATCH"
    assert req.path == "/apis/g/v1/namespaces/a/things/b"
    assert req.query["labelSelector"] == "x=y,z"
    assert req.query["watch"] == "true"
    assert req.headers["User-Agent"] == "dispatch/9"
    assert req.headers["Authorization"] == "Bearer tok"
    assert req.headers["Content-Type"] == "application/merge-patch+json"
    assert bodies[0] == b'{"spec": {"n": 1}}'


async def test_requests_share_a_bounded_pool_that_watches_do_not_take(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Requests other than watches use at most REQUEST_CONNECTIONS connections at once, and
    watches, each holding its connection for as long as it lasts, have their own: more watches
    than that still leave every request a connection (an operator watching many namespaces)."""
    limit = 8
    monkeypatch.setattr(_transport, "REQUEST_CONNECTIONS", limit)
    in_flight = most = 0
    peers: set[object] = set()
    release = asyncio.Event()

    async def handle(req: web.Request) -> web.StreamResponse:
        nonlocal in_flight, most
        if req.query.get("watch") == "true":
            response = web.StreamResponse()
            await response.prepare(req)  # the headers go; the body never ends until the test does
            await release.wait()
            return response
        assert req.transport is not None
        peers.add(req.transport.get_extra_info("peername"))
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.05)
        in_flight -= 1
        return web.json_response({"ok": True})

    async with serving(handle) as host, KubeClient(Connection(host=host)) as client:
        async with asyncio.timeout(20):  # sharing one bounded pool, a watch or a request would wait
            watches = [
                await open_request(client, "GET", "/w", query={"watch": True}) for _ in range(limit + 4)
            ]
            got = await asyncio.gather(*(request(client, "GET", f"/r/{i}") for i in range(limit * 3)))
        release.set()
        for watch in watches:
            watch.close()
    assert got == [{"ok": True}] * (limit * 3)
    assert most == limit
    assert len(peers) == limit  # connections reused, never more opened

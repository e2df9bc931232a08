"""``--metrics-auth=kubernetes`` on the lab's real API server: /metrics answers only a bearer token
the API server authenticates (TokenReview) and authorizes for ``get`` on ``/metrics``
(SubjectAccessReview), over TLS; an anonymous scrape, an invented token and a ServiceAccount
without the grant are refused."""

from __future__ import annotations

import asyncio
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.conftest import OperatorProcess, await_for, free_port
from tests.support.controlplane import loopback_tls
from tests.support.kube import KubeCluster

pytestmark = pytest.mark.integration


def get(url: str, ca: Path, token: str | None) -> tuple[int, str]:
    context = ssl.create_default_context(cafile=str(ca))
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=10, context=context) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


async def test_metrics_refuse_a_scrape_the_api_server_does_not_authorize(
    crds: KubeCluster, namespace: str, operator: Callable[..., OperatorProcess], tmp_path: Path
) -> None:
    certs = tmp_path / "metrics-tls"
    certs.mkdir()
    _server, ca = loopback_tls(certs, "metrics-test-ca")
    reader = f"dispatch-metrics-reader-{namespace}"
    crds.apply(
        [
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": n, "namespace": namespace}}
            for n in ("scraper", "stranger")
        ]
        + [
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": reader},
                "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}],
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": reader},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": reader},
                "subjects": [{"kind": "ServiceAccount", "name": "scraper", "namespace": namespace}],
            },
        ]
    )
    try:
        token = {
            n: crds.kubectl("create", "token", n, f"--namespace={namespace}", "--duration=1h").strip()
            for n in ("scraper", "stranger")
        }
        port = free_port()
        operator(
            f"--metrics-port={port}",
            "--metrics-addr=127.0.0.1",
            "--metrics-auth=kubernetes",
            f"--metrics-cert-dir={certs}",
        )
        url = f"https://127.0.0.1:{port}/metrics"

        def answered() -> tuple[int, str] | None:
            try:
                return get(url, ca, None)
            except (urllib.error.URLError, ConnectionError):
                return None

        code, _ = await await_for("the metrics server", answered)
        assert code == 401, "a scrape without a token"
        assert (await asyncio.to_thread(get, url, ca, "not-a-token"))[0] == 401
        code, body = await asyncio.to_thread(get, url, ca, token["stranger"])
        assert code == 403, "authenticated, but not allowed to get /metrics"
        assert "dispatch_" not in body
        code, body = await asyncio.to_thread(get, url, ca, token["scraper"])
        assert code == 200
        assert "dispatch_build_info" in body
    finally:
        crds.kubectl("delete", "clusterrolebinding,clusterrole", reader, "--ignore-not-found", check=False)

"""The lab's API access (:class:`LabApi`): ``kubectl`` and raw requests as the cluster admin, the
pods and nodes it reads, and waiting on a probe. The base of :class:`~tests.support.lab_cluster.Lab`.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.support.controlplane import (
    ControlPlane,
)
from tests.support.lab_setup import (
    NODE_PREFIX,
    ApiStatus,
    LabError,
)


class LabApi:
    """A running lab's control plane as the cluster admin reads and writes it."""

    def __init__(self, cp: ControlPlane, node_count: int) -> None:
        self.cp = cp
        self.node_count = node_count
        self._ssl: Any = None

    @property
    def kubeconfig(self) -> Path:
        return self.cp.kubeconfig

    @property
    def server(self) -> str:
        return self.cp.server

    @property
    def kubectl_bin(self) -> str:
        assert self.cp.binaries is not None
        return self.cp.binaries.kubectl

    @property
    def nodes(self) -> list[str]:
        return [f"{NODE_PREFIX}{i}" for i in range(self.node_count)]

    # ---- API access ----------------------------------------------------------------

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120.0
    ) -> str:
        argv = [self.kubectl_bin, f"--kubeconfig={self.kubeconfig}", *args]
        proc = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise LabError(f"kubectl {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc.stdout

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        query: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """One API request as the admin (no kubectl process); raises ApiStatus on non-2xx."""
        if self._ssl is None:
            self._ssl = self.cp.admin_ssl_context()
        url = self.server + path + (("?" + urllib.parse.urlencode(query)) if query else "")
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": content_type})
        try:
            with urllib.request.urlopen(req, timeout=30, context=self._ssl) as resp:
                out: dict[str, Any] = json.loads(resp.read() or b"{}")
                return out
        except urllib.error.HTTPError as e:
            text = e.read().decode(errors="replace")
            e.close()
            raise ApiStatus(e.code, f"{method} {path}: HTTP {e.code}: {text}") from None

    def mint_user(self, name: str, groups: Sequence[str] = ()) -> Path:
        return self.cp.mint_user(name, groups)

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
        except ApiStatus as e:
            if e.code == 404:
                return None
            raise

    def pods(self, namespace: str, label_selector: str = "") -> list[dict[str, Any]]:
        query = {"labelSelector": label_selector} if label_selector else None
        out = self.request("GET", f"/api/v1/namespaces/{namespace}/pods", query=query)
        return list(out.get("items") or [])

    def node(self, name: str) -> dict[str, Any] | None:
        try:
            return self.request("GET", f"/api/v1/nodes/{name}")
        except ApiStatus as e:
            if e.code == 404:
                return None
            raise

    def ready_nodes(self) -> set[str]:
        items = self.request("GET", "/api/v1/nodes").get("items") or []
        return {
            n["metadata"]["name"]
            for n in items
            if any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in n.get("status", {}).get("conditions") or ()
            )
        }

    def wait(self, what: str, probe: Any, timeout: float = 90.0, interval: float = 0.1) -> Any:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            last = probe()
            if last:
                return last
            time.sleep(interval)
        raise LabError(f"timed out waiting for {what}; last: {last!r}")

    def pod_node(self, namespace: str, name: str, timeout: float = 60.0) -> str:
        """The node a pod is bound to (waits for the binding)."""

        def bound() -> str:
            pod = self.pod(namespace, name)
            return str((pod or {}).get("spec", {}).get("nodeName") or "")

        return str(self.wait(f"pod {namespace}/{name} bound to a node", bound, timeout))

    def annotate_pod(self, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None:
        self.request(
            "PATCH",
            f"/api/v1/namespaces/{namespace}/pods/{name}",
            {"metadata": {"annotations": dict(annotations)}},
            content_type="application/merge-patch+json",
        )


__all__ = ["LabApi"]

"""An operator process seen from outside, as its users see it: the text of its ``/metrics`` and
the holder of its leader lease.
"""

from __future__ import annotations

import urllib.request

from dispatch._constants import LEASE_NAME
from dispatch._kubeclient import Client, request


def scrape(url: str) -> str:
    """The body of ``url`` (an operator's ``/metrics``), as text."""
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def samples(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


def lease_path(namespace: str) -> str:
    """The API path of the operator's leader lease in ``namespace``."""
    return f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{LEASE_NAME}"


async def holder(api: Client, namespace: str) -> str:
    """Who holds the operator's lease in ``namespace`` ("" when nobody does)."""
    lease = await request(api, "GET", lease_path(namespace))
    return str((lease.get("spec") or {}).get("holderIdentity") or "")

#!/usr/bin/env python3
"""Benchmark: what the restart's three lists cost kube-apiserver, by the way they are asked for.

    .venv/bin/python bench/list_server.py KUBECONFIG [--namespace bench] [--rounds 2]

Against a lab that holds the jobs (``bench/operator_scale.py ... --hold FILE`` keeps one, and prints
its kubeconfig), for the DispatchJobs, the PyTorchJobs and the pods of the namespace (the operator's
label selector on the last two), one after another: a consistent list in pages of 100 (what an
informer does where the API server serves no streamed list), the same at ``resourceVersion=0`` (the watch
cache, one answer), and a streamed list (``sendInitialEvents``, read to the bookmark that ends its
initial events; as they list now). For each: kube-apiserver's CPU (from /proc: the newest process
named kube-apiserver on this machine), wall time, bytes and objects; the client's JSON decoding
with the collector paused, as during a restart. The machine's load beside each line.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "operator"))

from dispatch._kubeclient import KubeClient, open_request, streamed  # noqa: E402
from dispatch._kubeclient._informer import ends_initial_events  # noqa: E402
from dispatch._kubeclient._transport import load_connection  # noqa: E402

SELECTOR = "dispatch.dev/job"


def apiserver() -> int:
    out = subprocess.run(["pgrep", "-n", "-x", "kube-apiserver"], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[0])


def cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def paged(api: KubeClient, path: str, selector: str | None, rv0: bool) -> tuple[int, int, float]:
    token, items, size, decoding = None, 0, 0, 0.0
    while True:
        query: dict[str, Any] = {"limit": 100, "continue": token, "labelSelector": selector}
        if rv0:
            query["resourceVersion"] = "0"
        response = await open_request(api, "GET", path, query=query, request_timeout=120)
        async with streamed(response):
            raw = await response.read()
        start = time.process_time()
        page = json.loads(raw)
        decoding += time.process_time() - start
        size += len(raw)
        items += len(page.get("items") or [])
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return items, size, decoding


async def streamed_list(api: KubeClient, path: str, selector: str | None) -> tuple[int, int, float]:
    query = {
        "watch": True,
        "sendInitialEvents": True,
        "resourceVersionMatch": "NotOlderThan",
        "allowWatchBookmarks": True,
        "timeoutSeconds": 120,
        "labelSelector": selector,
    }
    response = await open_request(api, "GET", path, query=query, request_timeout=None)
    items, size, decoding = 0, 0, 0.0
    async with streamed(response):
        while True:
            line = await response.content.readline()
            if not line:
                raise RuntimeError("the watch ended before its initial events")
            size += len(line)
            start = time.process_time()
            event = json.loads(line)
            decoding += time.process_time() - start
            if event["type"] != "BOOKMARK":
                items += 1
            elif ends_initial_events(event["type"], event["object"]):
                return items, size, decoding


async def run(kubeconfig: str, namespace: str, rounds: int) -> list[dict[str, Any]]:
    resources = {
        "dispatchjobs": (f"/apis/dispatch.dev/v1alpha1/namespaces/{namespace}/dispatchjobs", None),
        "pytorchjobs": (f"/apis/kubeflow.org/v1/namespaces/{namespace}/pytorchjobs", SELECTOR),
        "pods": (f"/api/v1/namespaces/{namespace}/pods", SELECTOR),
    }
    server = apiserver()
    out: list[dict[str, Any]] = []
    gc.disable()
    async with KubeClient(load_connection(kubeconfig)) as api:
        for _ in range(rounds):
            for resource, (path, selector) in resources.items():
                for how in ("pages of 100", "resourceVersion=0", "streamed"):
                    before, start = cpu(server), time.monotonic()
                    if how == "streamed":
                        items, size, decoding = await streamed_list(api, path, selector)
                    else:
                        items, size, decoding = await paged(api, path, selector, how != "pages of 100")
                    line = {
                        "resource": resource,
                        "how": how,
                        "apiserver_cpu_s": round(cpu(server) - before, 2),
                        "wall_s": round(time.monotonic() - start, 2),
                        "client_decode_s": round(decoding, 2),
                        "objects": items,
                        "mb": round(size / 1e6, 1),
                        "load": round(os.getloadavg()[0], 2),
                    }
                    print(json.dumps(line), flush=True)
                    out.append(line)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("kubeconfig")
    parser.add_argument("--namespace", default="bench")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    asyncio.run(run(args.kubeconfig, args.namespace, args.rounds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env python3
"""Benchmark: what kopf itself costs per DispatchJob when it only keeps the deletion finalizer.

    .venv/bin/python bench/kopf_cost.py [--jobs 10000] [--json out.json]

The operator's supervision loop (dispatch._controller.loop) does not need kopf, but kopf still watches
every DispatchJob for its ``on.delete`` handler (the finalizer). This measures that share alone, on
the lab's API server (no training operator): N DispatchJobs that already carry the finalizer, then
two processes with the operator's imports, one running kopf with the operator's settings and a
no-op ``on.delete`` handler, one idle. It reports kopf's RSS above the idle process's once kopf has
seen every object, the CPU kopf spent on the initial list, and the CPU per event when every
object changes once (a status write, as a record write would be).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "operator"))

from dispatch._kubeclient import MERGE_PATCH, CustomObjects, new_client, request  # noqa: E402
from tests.support.controlplane import resolve_binaries  # noqa: E402
from tests.support.lab import Lab  # noqa: E402

NAMESPACE = "kopf-cost"

CHILD = """
import asyncio, sys, kopf
sys.path.insert(0, {operator!r})
from dispatch._constants import GROUP, PLURAL, VERSION
from dispatch._controller.main import _connection_info
from dispatch._controller.settings import operator_settings
from dispatch._kubeclient import load_configuration

async def main() -> None:
    configuration = await load_configuration({kubeconfig!r})
    if not {with_kopf}:
        await asyncio.sleep(3600)
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**_):
        return _connection_info(configuration)

    @kopf.on.delete(GROUP, VERSION, PLURAL, id="end-objects", registry=registry)
    async def end_objects(**_):
        return None

    await kopf.operator(registry=registry, settings=operator_settings(), standalone=True,
                        clusterwide=False, namespaces=[{namespace!r}])

asyncio.run(main())
"""


def job(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "dispatch.dev/v1alpha1",
        "kind": "DispatchJob",
        "metadata": {"name": f"job-{i:05d}", "finalizers": ["dispatch.dev/finalizer"]},
        "spec": {
            "backend": "kubeflow",
            "command": ["torchrun", "train.py"],
            "nodes": 1,
            "kubeflow": {"image": "pytorch/pytorch:2.4", "resources": {"cpu": "1", "memory": "1Gi"}},
            "recovery": {"rules": [{"on": ["preempted"], "budget": 2}]},
        },
    }


async def each(n: int, act: Any, concurrency: int = 32) -> None:
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(n):
        queue.put_nowait(i)

    async def worker() -> None:
        while not queue.empty():
            await act(queue.get_nowait())

    await asyncio.gather(*(worker() for _ in range(concurrency)))


def usage(pid: int) -> tuple[float, float]:
    """(RSS MiB, CPU seconds) of a process."""
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return rss, (int(fields[11]) + int(fields[12])) / ticks


def settle(pid: int, quiet: float = 5.0, limit: float = 360.0) -> tuple[float, float]:
    """Wait until the process has used no CPU for ``quiet`` seconds (at most ``limit``: kopf that
    retries its patches against an overloaded API server never goes quiet); its (RSS, CPU) then."""
    start = time.monotonic()
    last = usage(pid)
    still = time.monotonic()
    while time.monotonic() - start < limit:
        time.sleep(1.0)
        now = usage(pid)
        if now[1] - last[1] > 0.02:
            still = time.monotonic()
        last = now
        if time.monotonic() - still >= quiet:
            break
    return last


async def _all(kubeconfig: Path, n: int, change: bool) -> None:
    """Create the N DispatchJobs, or change each once (a status write, as a record write is)."""
    api = await new_client(str(kubeconfig))
    custom = CustomObjects(api)

    async def act(i: int) -> None:
        if change:
            await request(
                api,
                "PATCH",
                f"/apis/dispatch.dev/v1alpha1/namespaces/{NAMESPACE}/dispatchjobs/job-{i:05d}/status",
                body={"status": {"observedState": "pending"}},
                content_type=MERGE_PATCH,
            )
        else:
            await custom.create(NAMESPACE, job(i))

    try:
        await each(n, act)
    finally:
        await api.close()


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="dispatch-kopf-cost-"))
    lab = Lab(work / "lab", training_operator=False, nodes=1)
    lab.start()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        kubectl = [resolve_binaries().kubectl, f"--kubeconfig={lab.kubeconfig}"]
        crd = str(REPO / "crds/dispatch.dev_dispatchjobs.yaml")
        subprocess.run([*kubectl, "apply", "--server-side", "-f", crd], check=True, capture_output=True)
        subprocess.run(
            [*kubectl, "wait", "--for=condition=Established", "crd/dispatchjobs.dispatch.dev"],
            check=True,
            capture_output=True,
        )
        subprocess.run([*kubectl, "create", "namespace", NAMESPACE], check=True, capture_output=True)
        began = time.monotonic()
        asyncio.run(_all(lab.kubeconfig, args.jobs, change=False))
        print(f"{args.jobs} DispatchJobs created in {time.monotonic() - began:.1f}s", file=sys.stderr)
        for with_kopf in (False, True):
            code = CHILD.format(
                operator=str(REPO / "operator"),
                kubeconfig=str(lab.kubeconfig),
                namespace=NAMESPACE,
                with_kopf=with_kopf,
            )
            log = (work / f"child-{with_kopf}.log").open("wb")
            procs.append(subprocess.Popen([sys.executable, "-c", code], stdout=log, stderr=subprocess.STDOUT))
        idle, kopf_proc = procs
        listed_rss, listed_cpu = settle(kopf_proc.pid)
        print(f"kopf saw the list: RSS {listed_rss:.1f} MiB, CPU {listed_cpu:.1f}s", file=sys.stderr)
        asyncio.run(_all(lab.kubeconfig, args.jobs, change=True))
        changed_rss, changed_cpu = settle(kopf_proc.pid)
        idle_rss, _ = usage(idle.pid)
        return {
            "jobs": args.jobs,
            "idle_process_rss_mib": round(idle_rss, 1),
            "kopf_rss_after_list_mib": round(listed_rss, 1),
            "kopf_rss_after_changes_mib": round(changed_rss, 1),
            "kopf_extra_kib_per_job": round((changed_rss - idle_rss) * 1024 / args.jobs, 2),
            "kopf_cpu_initial_list_s": round(listed_cpu, 2),
            "kopf_cpu_ms_per_event": round((changed_cpu - listed_cpu) * 1000 / args.jobs, 3),
            "loadavg": [round(x, 2) for x in os.getloadavg()],
        }
    finally:
        for p in procs:
            p.kill()
            p.wait()
        lab.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=10000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    figures = run(args)
    text = json.dumps(figures, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()

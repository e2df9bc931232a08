#!/usr/bin/env python3
"""Benchmark: the Kubeflow adapter's reaction to real kube-scheduler preemptions.

    .venv/bin/python bench/kubeflow_reaction.py [--preemptions 100] [--json out.json]

It starts the lab (tests/support/lab.py: kube-apiserver with an audit log, kube-scheduler,
kube-controller-manager, kwok, the real training operator v1.9.3), and runs one job through the
library supervisor (KubeflowBackend + MemoryStore, so every API write counted is the adapter's)
under its own identity (``dispatch-bench``). The job's rule is ``preempted -> resubmit`` with a
budget of N; each submission's pod is preempted by kube-scheduler for a pod of a higher
PriorityClass that needs the whole node (the lab's ``preempt_pod``), N times, then it succeeds.

Per recovery, from this process's own watches on the API server (not the adapter's):

* failure visible: the first event showing the victim pod ``DisruptionTarget=True``;
* created: the first event of the next submission's PyTorchJob;
* released: the first event showing that PyTorchJob with ``suspend: false``.

API writes per recovery: the audit log's create/update/patch/delete by ``dispatch-bench`` between
one preemption and the next, by resource and verb.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "operator"))

from dispatch import (  # noqa: E402
    CauseKind,
    JobSpec,
    KubeflowOptions,
    RecoveryPolicy,
    Resources,
    Rule,
    Supervisor,
)
from dispatch._backends.kubeflow._adapter import CAPABILITIES, KubeflowBackend  # noqa: E402
from dispatch._kubeclient import Informer, new_client  # noqa: E402
from tests.support.lab import Lab  # noqa: E402
from tests.support.supervised import stored  # noqa: E402

NAMESPACE = "bench"
JOB = "preempted"
USER = "dispatch-bench"
DISPATCH_CRD = REPO / "crds" / "dispatch.dev_dispatchjobs.yaml"


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))]


class Clock:
    """First-seen times of the events that matter, from this process's own watches."""

    def __init__(self) -> None:
        self.failed: dict[int, float] = {}
        self.created: dict[int, float] = {}
        self.released: dict[int, float] = {}
        self.running: dict[int, asyncio.Event] = {}

    def submission(self, body: dict[str, Any]) -> int | None:
        raw = (body.get("metadata", {}).get("labels") or {}).get("dispatch.dev/submission")
        return int(raw) if raw and raw.isdigit() else None

    def pj(self, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        now = time.monotonic()
        if new is None or (n := self.submission(new)) is None:
            return
        self.created.setdefault(n, now)
        if not (new.get("spec", {}).get("runPolicy") or {}).get("suspend"):
            self.released.setdefault(n, now)

    def pod(self, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        now = time.monotonic()
        if new is None or (n := self.submission(new)) is None:
            return
        status = new.get("status", {})
        if any(
            c.get("type") == "DisruptionTarget" and c.get("status") == "True"
            for c in status.get("conditions") or []
        ):
            self.failed.setdefault(n, now)
        if status.get("phase") == "Running" and not new["metadata"].get("deletionTimestamp"):
            self.running.setdefault(n, asyncio.Event()).set()


async def run(lab: Lab, preemptions: int, crd: Path = DISPATCH_CRD) -> dict[str, Any]:
    lab.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd))
    lab.kubectl("wait", "--for=condition=Established", "crd/dispatchjobs.dispatch.dev", "--timeout=60s")
    lab.kubectl("create", "namespace", NAMESPACE)
    owner = {
        "apiVersion": "dispatch.dev/v1alpha1",
        "kind": "DispatchJob",
        "metadata": {"name": JOB, "namespace": NAMESPACE},
        "spec": {"backend": "kubeflow", "command": ["python", "train.py"], "kubeflow": {"image": "img:1"}},
    }
    lab.kubectl("apply", "-f", "-", input=json.dumps(owner))
    job = f"{NAMESPACE}/{JOB}"
    spec = JobSpec(
        name=JOB,
        command=("python", "train.py"),
        recovery=RecoveryPolicy(rules=(Rule(on=(CauseKind.PREEMPTED,), budget=preemptions),)),
        kubeflow=KubeflowOptions(image="example.invalid/train:1", resources=Resources(cpu="1", memory="1Gi")),
    )
    store, _ = await stored(job, spec, CAPABILITIES)
    clock = Clock()
    watcher_api = await new_client(str(lab.kubeconfig))
    watches = [
        Informer(
            watcher_api,
            f"/apis/kubeflow.org/v1/namespaces/{NAMESPACE}/pytorchjobs",
            label_selector="app.kubernetes.io/managed-by=dispatch",
            on_change=clock.pj,
            what="bench pytorchjobs",
        ),
        Informer(
            watcher_api,
            f"/api/v1/namespaces/{NAMESPACE}/pods",
            label_selector="app.kubernetes.io/managed-by=dispatch",
            on_change=clock.pod,
            what="bench pods",
        ),
    ]
    watch_tasks = [asyncio.create_task(w.run()) for w in watches]
    adapter_api = await new_client(str(lab.mint_user(USER, ["system:masters"])))
    backend = KubeflowBackend(adapter_api)
    supervisor = asyncio.create_task(Supervisor(backend, store).run(job))
    marks: list[int] = []
    try:
        for n in range(1, preemptions + 1):
            async with asyncio.timeout(120):
                await clock.running.setdefault(n, asyncio.Event()).wait()
            marks.append(lab.audit_mark())
            await asyncio.to_thread(lab.preempt_pod, NAMESPACE, f"{JOB}-{n}-master-0")
            print(f"preemption {n}/{preemptions}", file=sys.stderr, flush=True)
        async with asyncio.timeout(120):
            await clock.running.setdefault(preemptions + 1, asyncio.Event()).wait()
        marks.append(lab.audit_mark())
        lab.exit_pod(NAMESPACE, f"{JOB}-{preemptions + 1}-master-0", 0)
        async with asyncio.timeout(120):
            record = await supervisor
    finally:
        supervisor.cancel()
        await asyncio.gather(supervisor, return_exceptions=True)
        await backend.aclose()
        await adapter_api.close()
        for task in watch_tasks:
            task.cancel()
        await asyncio.gather(*watch_tasks, return_exceptions=True)
        await watcher_api.close()
    to_created = [clock.created[n + 1] - clock.failed[n] for n in range(1, preemptions + 1)]
    to_released = [clock.released[n + 1] - clock.failed[n] for n in range(1, preemptions + 1)]
    writes: list[Counter[str]] = []
    for start, end in itertools.pairwise(marks):
        events = [e for e in lab.audit_writes(start, user=USER) if e.get("auditID")]
        seen_end = {e["auditID"] for e in lab.audit_writes(end, user=USER)}
        writes.append(
            Counter(
                f"{e['verb']} {e['objectRef'].get('resource')}"
                + (f"/{e['objectRef']['subresource']}" if e["objectRef"].get("subresource") else "")
                for e in events
                if e["auditID"] not in seen_end
            )
        )
    per = [sum(c.values()) for c in writes]
    total: Counter[str] = sum(writes, Counter())
    return {
        "preemptions": preemptions,
        "state": str(record.state),
        "settled": record.settled,
        "causes": sorted({str(s.cause.kind) for s in record.submissions if s.cause}),
        "failure_to_created_ms": {
            "median": round(statistics.median(to_created) * 1000, 1),
            "p99": round(pct(to_created, 99) * 1000, 1),
        },
        "failure_to_released_ms": {
            "median": round(statistics.median(to_released) * 1000, 1),
            "p99": round(pct(to_released, 99) * 1000, 1),
        },
        "writes_per_recovery": {"median": statistics.median(per), "max": max(per)},
        "writes_by_kind": {k: round(v / len(writes), 2) for k, v in sorted(total.items())},
        "lab_start_seconds": round(lab.start_seconds, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preemptions", type=int, default=100)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--crd", type=Path, default=DISPATCH_CRD, help="the DispatchJob CRD to install")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dispatch-kfbench-") as tmp, Lab(Path(tmp) / "lab") as lab:
        result = asyncio.run(run(lab, args.preemptions, args.crd))
    result["loadavg"] = Path("/proc/loadavg").read_text().split()[:3]
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()

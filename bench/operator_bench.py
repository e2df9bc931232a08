#!/usr/bin/env python3
"""Benchmark: the operator's reaction to failures on the test control plane.

    .venv/bin/python bench/operator_bench.py [--recoveries 100] [--no-events] [--json out.json]

What it does: starts the lab (tests/support/lab.py: kube-apiserver with an audit log,
kube-scheduler, kube-controller-manager, kwok, Kubeflow's real training operator), installs the
DispatchJob CRD, runs the operator as a process (``python -m dispatch._controller``) under its own identity
(client certificate ``dispatch-operator``). One DispatchJob with the rule ``preempted -> resubmit,
budget N`` is preempted by kube-scheduler N times (the lab's ``preempt_pod``), then succeeds.

What it measures, per recovery, from this process's own watches on the API server:

* failure seen: the first watch event showing the canonical's pod preempted (DisruptionTarget) or
  Failed;
* created: the first watch event of the next submission's PyTorchJob;
* released: the first watch event showing that PyTorchJob unsuspended.

API writes per recovery come from the API server's audit log: every create/update/patch/delete by
the operator's identity between one failure and the next, by resource (kopf's own writes included,
since they carry the same identity).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "operator"))

from kubernetes_asyncio import config as kconfig  # noqa: E402
from kubernetes_asyncio.client import ApiClient, Configuration, CoreV1Api, CustomObjectsApi  # noqa: E402

from dispatch._kubeclient import streamed  # noqa: E402
from tests.support.controlplane import resolve_binaries  # noqa: E402
from tests.support.lab import Kubeflow, Lab  # noqa: E402

NAMESPACE = "bench"
JOB = "bench"
OPERATOR_USER = "dispatch-operator"
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


class Timeline:
    """Client-side receive times (time.time()) of what the watches show."""

    def __init__(self) -> None:
        self.created: dict[str, float] = {}
        self.released: dict[str, float] = {}
        self.failed: dict[str, float] = {}  # PyTorchJob name -> first pod seen Failed
        self.changed = asyncio.Event()

    def pytorchjob(self, obj: dict[str, Any], now: float) -> None:
        name = obj["metadata"]["name"]
        self.created.setdefault(name, now)
        if not ((obj.get("spec") or {}).get("runPolicy") or {}).get("suspend"):
            self.released.setdefault(name, now)
        self.changed.set()

    def pod(self, obj: dict[str, Any], now: float) -> None:
        owner = (obj["metadata"].get("labels") or {}).get("training.kubeflow.org/job-name")
        status = obj.get("status") or {}
        disrupted = any(
            c.get("type") == "DisruptionTarget" and c.get("status") == "True"
            for c in status.get("conditions") or ()
        )
        if owner and (disrupted or status.get("phase") == "Failed"):
            self.failed.setdefault(owner, now)
        self.changed.set()


async def follow(list_call: Any, on_object: Any, on_deleted: Any = None) -> None:
    """List, then watch forever, calling ``on_object(obj, receive_time)`` (and
    ``on_deleted(obj, receive_time)`` for a DELETED event, when given).

    ``list_call(**kwargs)`` is a kubernetes_asyncio list method bound to its resource.
    """
    rv: str | None = None
    while True:
        try:
            if rv is None:
                listed = await list_call(_preload_content=False)
                async with streamed(listed):  # cancelled mid-read: the socket goes at once
                    body = json.loads(await listed.read())
                for item in body.get("items", []):
                    on_object(item, time.time())
                if body.get("kind") == "Status":  # the resource not served yet (a CRD being set up)
                    raise RuntimeError(f"list: {body.get('code')} {body.get('message')}")
                rv = body["metadata"]["resourceVersion"]
            response = await list_call(
                watch=True, resource_version=rv, allow_watch_bookmarks=True, _preload_content=False
            )
            async with streamed(response):
                buffer = b""
                async for chunk in response.content.iter_any():
                    buffer += chunk
                    while b"\n" in buffer:
                        line, buffer = buffer.split(b"\n", 1)
                        if not line.strip():
                            continue
                        now = time.time()
                        event = json.loads(line)
                        # An ERROR event, or a Status in place of the stream (a restarted API server
                        # refusing the resumed resourceVersion): list again.
                        if event.get("type", "ERROR") == "ERROR":
                            rv = None
                            break
                        rv = event["object"]["metadata"]["resourceVersion"]
                        if event["type"] in ("ADDED", "MODIFIED"):
                            on_object(event["object"], now)
                        elif event["type"] == "DELETED" and on_deleted is not None:
                            on_deleted(event["object"], now)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            print(f"watch: {type(error).__name__}: {error}; again", file=sys.stderr)
            await asyncio.sleep(0.2)


def dispatchjob(name: str, namespace: str, budget: int, **kubeflow: Any) -> dict[str, Any]:
    """A DispatchJob on Kubeflow whose one rule is ``preempted -> resubmit`` with BUDGET."""
    return {
        "apiVersion": "dispatch.dev/v1alpha1",
        "kind": "DispatchJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "backend": "kubeflow",
            "command": ["torchrun", "train.py"],
            "nodes": 1,
            "kubeflow": {"image": "pytorch/pytorch:2.4", **kubeflow},
            "recovery": {"rules": [{"on": ["preempted"], "budget": budget}]},
        },
    }


async def wait_until(timeline: Timeline, predicate: Any, what: str, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        timeline.changed.clear()
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"timed out waiting for {what}")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(min(left, 1.0)):
                await timeline.changed.wait()


def audit_writes(path: Path) -> list[tuple[float, str]]:
    """(time, "verb resource[/subresource]") of every write by the operator's identity."""
    out: list[tuple[float, str]] = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        event = json.loads(line)
        if event.get("stage") != "ResponseComplete" or event.get("verb") not in WRITE_VERBS:
            continue
        if (event.get("user") or {}).get("username") != OPERATOR_USER:
            continue
        ref = event.get("objectRef") or {}
        resource = ref.get("resource", "?") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        when = datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00")).timestamp()
        out.append((when, f"{event['verb']} {resource}"))
    return out


def start(args: argparse.Namespace) -> tuple[Lab, subprocess.Popen[bytes], Path, Path, list[str]]:
    """The lab (its apiserver writes an audit log), the CRD, the namespace and the operator process."""
    work = Path(tempfile.mkdtemp(prefix="dispatch-bench-"))
    cp = Lab(work / "lab")
    cp.start()
    print(f"lab up in {cp.start_seconds:.1f}s", file=sys.stderr)
    audit = cp.audit_log
    kubectl = [resolve_binaries().kubectl, f"--kubeconfig={cp.kubeconfig}"]
    subprocess.run(
        [*kubectl, "apply", "--server-side", "-f", str(REPO / "crds/dispatch.dev_dispatchjobs.yaml")],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [*kubectl, "wait", "--for=condition=Established", "crd/dispatchjobs.dispatch.dev", "--timeout=60s"],
        check=True,
        capture_output=True,
    )
    subprocess.run([*kubectl, "create", "namespace", NAMESPACE], check=True, capture_output=True)
    identity = cp.mint_user(OPERATOR_USER, ["system:masters"])
    log_path = work / "operator.log"
    argv = [
        sys.executable,
        "-m",
        "dispatch._controller",
        f"--kubeconfig={identity}",
        f"--namespace={NAMESPACE}",
    ]
    argv += ["--log-level=WARNING", *(["--no-events"] if args.no_events else [])]
    with log_path.open("wb") as log:
        operator = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True
        )
    return cp, operator, audit, log_path, kubectl


async def measure(
    args: argparse.Namespace, cp: Lab, audit: Path, log_path: Path, kubectl: list[str]
) -> dict[str, Any]:
    cfg = Configuration()
    await kconfig.load_kube_config(config_file=str(cp.kubeconfig), client_configuration=cfg)
    timeline = Timeline()
    fake = Kubeflow(cp)
    async with ApiClient(configuration=cfg) as api:
        custom, core = CustomObjectsApi(api), CoreV1Api(api)
        watches = [
            asyncio.create_task(
                follow(
                    functools.partial(
                        custom.list_namespaced_custom_object,
                        "kubeflow.org",
                        "v1",
                        NAMESPACE,
                        "pytorchjobs",
                    ),
                    timeline.pytorchjob,
                )
            ),
            asyncio.create_task(follow(functools.partial(core.list_namespaced_pod, NAMESPACE), timeline.pod)),
        ]
        n = args.recoveries
        manifest = dispatchjob(JOB, NAMESPACE, n)
        await asyncio.to_thread(
            subprocess.run, [*kubectl, "apply", "-f", "-"], input=json.dumps(manifest).encode(), check=True
        )
        started = time.time()
        for k in range(1, n + 2):
            name = f"{JOB}-{k}"
            await wait_until(timeline, lambda name=name: name in timeline.released, f"{name} released")
            pods = await asyncio.wait_for(fake.wait_pods(NAMESPACE, name, 1), 60)
            while any((p.get("status") or {}).get("phase") != "Running" for p in pods):
                await asyncio.sleep(0.02)
                pods = await fake.pods(NAMESPACE, name)
            if k <= n:
                await fake.preempt(NAMESPACE, name)
            else:
                await fake.succeed(NAMESPACE, name)
            if k % 10 == 0:
                print(f"  {k} recoveries", file=sys.stderr)
        finished = time.time()
        for w in watches:
            w.cancel()
        for w in watches:
            with contextlib.suppress(asyncio.CancelledError):
                await w
    await asyncio.sleep(1.0)  # let the audit log flush the last writes
    created_ms, released_ms = [], []
    for k in range(1, n + 1):
        failed = timeline.failed[f"{JOB}-{k}"]
        created_ms.append((timeline.created[f"{JOB}-{k + 1}"] - failed) * 1000)
        released_ms.append((timeline.released[f"{JOB}-{k + 1}"] - failed) * 1000)
    writes = audit_writes(audit)
    per_recovery: list[Counter[str]] = []
    bounds = [timeline.failed[f"{JOB}-{k}"] for k in range(1, n + 1)] + [
        timeline.failed.get(f"{JOB}-{n + 1}", finished)
    ]
    for k in range(n):
        lo, hi = bounds[k], bounds[k + 1] if k + 1 < len(bounds) else finished
        # a write that the watch saw before the failure was stamped can still belong to it: the
        # audit clock and the watch's receive time are the same host's clock
        per_recovery.append(Counter(what for when, what in writes if lo - 0.005 <= when < hi - 0.005))
    totals = [sum(c.values()) for c in per_recovery]
    protocol_kinds = ("update dispatchjobs/status", "create pytorchjobs", "patch pytorchjobs")
    protocol = [sum(c[k] for k in protocol_kinds) for c in per_recovery]
    mean_by_kind = Counter[str]()
    for c in per_recovery:
        mean_by_kind.update(c)
    result = {
        "recoveries": n,
        "events": not args.no_events,
        "wall_seconds": round(finished - started, 1),
        "failure_to_created_ms": {
            "median": round(statistics.median(created_ms), 1),
            "p99": round(percentile(created_ms, 0.99), 1),
            "max": round(max(created_ms), 1),
        },
        "failure_to_released_ms": {
            "median": round(statistics.median(released_ms), 1),
            "p99": round(percentile(released_ms, 0.99), 1),
            "max": round(max(released_ms), 1),
        },
        "writes_per_recovery": {
            "median": statistics.median(totals),
            "min": min(totals),
            "max": max(totals),
            "mean_by_kind": {k: round(v / n, 2) for k, v in sorted(mean_by_kind.items())},
        },
        "protocol_writes_per_recovery_median": statistics.median(protocol),
        "operator_log": str(log_path),
        "audit_log": str(audit),
    }
    return result


def report(result: dict[str, Any], path: Path | None) -> None:
    """The figures as JSON on stdout, and in PATH when given."""
    text = json.dumps(result, indent=2)
    print(text)
    if path:
        path.write_text(text + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--recoveries", type=int, default=100, help="preemptions to recover from (1..100)")
    parser.add_argument("--no-events", action="store_true", help="run the operator without Kubernetes Events")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    if not 1 <= args.recoveries <= 100:
        parser.error("--recoveries must be 1..100 (a rule's budget is at most 100)")
    cp, operator, audit, log_path, kubectl = start(args)
    try:
        result = asyncio.run(measure(args, cp, audit, log_path, kubectl))
    finally:
        if operator.poll() is None:
            os.kill(operator.pid, signal.SIGTERM)
            try:
                operator.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.kill(operator.pid, signal.SIGKILL)
        cp.stop()
    report(result, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env python3
"""Benchmark: the operator at scale on the real stack, and the Job controller beside it.

    .venv/bin/python bench/operator_scale.py [--jobs 1000] [--preempt 1000] [--samples 30]
        [--operator-tree DIR] [--json out.json]

The lab (tests/support/lab.py: kube-apiserver with an audit log, kube-scheduler,
kube-controller-manager, kwok, Kubeflow's training operator v1.9.3) with the bench's own kwok
nodes, each exactly full with ``--slots`` pods of 1 cpu (so that any pod of a higher priority must
preempt). The operator runs as a user starts it (``python -m dispatch._controller`` with its documented
flags, its own client certificate ``dispatch-operator``, metrics on a loopback port), from this
tree or from ``--operator-tree`` (a ``git archive`` of another commit: before/after). DispatchJobs
are applied with kubectl. One run, in order:

1. creation: N DispatchJobs applied at once (4 kubectl processes); first submissions created per
   second, from this process's own watch on PyTorchJobs; then every pod Running;
2. steady: RSS of the operator (/proc) with N running jobs, per job over the empty operator; idle
   requests and writes per second and CPU over a quiet window;
3. restart: SIGTERM, start again; time until the operator's own "all known and decided" line (or,
   for an operator without it, until its requests go quiet), and its writes in that window;
4. reaction: ``--samples`` preemptions one at a time (the lab's ``preempt_pod``) with N jobs in
   the cache: failure visible -> next submission released, median/p99; writes, requests, 409s
   and CPU per recovery; after each sample, its floor: the same four writes (status, create of a
   held PyTorchJob, status, release) in a row by this process in a namespace no operator watches,
   so under the same load; the ratio of the medians;
5. mass preemption: every node but ``preempt / slots`` cordoned, one pod of PriorityClass
   lab-high per such node that needs the whole node; kube-scheduler preempts every job pod there
   (``--preempt`` in all); time until every preempted job's next submission is released, by this
   process's watches and by the API server's own clock (``server_clock``: the audit log's times of
   kube-scheduler's first write on each victim's pod and of the operator's release patches; the
   watches lag under the burst);
0. first, the peer: as many batch/v1 Jobs (podFailurePolicy: Ignore on DisruptionTarget) on nodes
   of the same shape (tainted for them alone), preempted the same way; time until every preempted
   Job has its replacement pod, by the watches and by the API server's clock
   (``peer_server_clock``); then its Jobs are deleted; the ratios to it at the end;
7. the floor: the operator stopped, as many status writes (merge patches on DispatchJobs' status
   in a namespace no operator watches), one at a time and 8 at a time.

An invariant monitor runs throughout: at every PyTorchJob event, no job may have two released
objects (unsuspended, and neither finished, deleted nor with a failed or disrupted pod). At the
end every preempted submission's recorded cause must be ``preempted``. The machine's load
(``os.getloadavg()``) is printed beside every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import functools
import json
import os
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter, defaultdict, deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, cast

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "operator"))

from kubernetes_asyncio import config as kconfig  # noqa: E402
from kubernetes_asyncio.client import (  # noqa: E402
    ApiClient,
    BatchV1Api,
    Configuration,
    CoreV1Api,
    CustomObjectsApi,
)
from kubernetes_asyncio.client.exceptions import ApiException  # noqa: E402

from bench.list_server import cpu  # noqa: E402
from bench.operator_bench import OPERATOR_USER, Timeline, dispatchjob, follow, percentile, report, wait_until  # noqa: E402
from tests.support.controlplane import resolve_binaries  # noqa: E402
from tests.support.lab import HIGH_PRIORITY, Lab, node_manifest, resolve_lab_binaries  # noqa: E402

NAMESPACE = "bench"
PEER_NAMESPACE = "bench-peer"
FLOOR_NAMESPACE = "bench-floor"
LABEL_JOB = "dispatch.dev/job"
KUBEFLOW_JOB = "training.kubeflow.org/job-name"
KUBEFLOW = "kubeflow.org"
PEER_JOB = "batch.kubernetes.io/job-name"
PEER_TAINT = "bench.dispatch.dev/peer"
"""Taint and label of the peer's nodes: only its Jobs' pods and their preemptors go there."""
PEER_TOLERATION = {"key": PEER_TAINT, "operator": "Exists", "effect": "NoSchedule"}
OPERATOR_FIELD_MANAGER = "dispatch-operator"
TRAINING_FIELD_MANAGER = "training-operator-lab"
"""The field managers of the objects --preload copies (as managedFields name them in a run)."""
APPLY: dict[str, Any] = {"_content_type": "application/apply-patch+yaml"}
MERGE: dict[str, Any] = {"_content_type": "application/merge-patch+json"}
"""The generated client's patch type (its stubs do not declare _content_type)."""
SYNCED = re.compile(r"all (\d+) jobs? known and decided")
"""The operator's own line once every job it found at start is known and decided; an operator
that does not log it (an older tree) is timed until its requests go quiet."""


def load() -> float:
    return round(os.getloadavg()[0], 2)


def stats(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "median": round(statistics.median(values), 1),
        "p99": round(percentile(list(values), 0.99), 1),
        "max": round(max(values), 1),
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def preempted(pod: dict[str, Any]) -> bool:
    """kube-scheduler's own mark on a pod it preempts (its ``DisruptionTarget`` reason): a taint
    manager's eviction from a node whose heartbeats lapsed is a disruption too, but not this."""
    return any(
        c.get("type") == "DisruptionTarget" and c.get("reason") == "PreemptionByScheduler"
        for c in (pod.get("status") or {}).get("conditions") or ()
    )


def disrupted(pod: dict[str, Any]) -> bool:
    status = pod.get("status") or {}
    return status.get("phase") == "Failed" or any(
        c.get("type") == "DisruptionTarget" and c.get("status") == "True"
        for c in status.get("conditions") or ()
    )


class World(Timeline):
    """What this process's own watches have seen, with receive times (time.time()): the
    Timeline's (PyTorchJob created and released, its pod's first failure) and more."""

    def __init__(self) -> None:
        super().__init__()
        self.dispatchjobs: dict[str, float] = {}  # name -> first seen
        self.ptj_job: dict[str, str] = {}  # PyTorchJob -> DispatchJob
        self.ptj_body: dict[str, dict[str, Any]] = {}
        self.by_job: dict[str, set[str]] = defaultdict(set)  # DispatchJob -> PyTorchJobs
        self.pods: dict[str, dict[str, Any]] = {}  # pod name -> {owner, node, phase, uid}
        self.violations: list[dict[str, Any]] = []
        self.events = 0
        self.preempted: dict[str, float] = {}
        """PyTorchJob -> when a pod of it was first seen preempted by kube-scheduler (a subset of
        ``failed``, which has every disruption: the mass preemption waits for these only)."""
        # the peer: batch/v1 Job -> pod uids in creation order, and each pod's first sight
        self.peer_pods: dict[str, list[str]] = defaultdict(list)
        self.peer_pod_seen: dict[str, float] = {}
        self.peer_pod_failed: dict[str, float] = {}
        self.peer_pod_phase: dict[str, str] = {}
        self.peer_pod_name: dict[str, str] = {}

    def _ended(self, name: str) -> bool:
        body = self.ptj_body[name]
        if body["metadata"].get("deletionTimestamp") or name in self.failed:
            return True
        return any(
            c.get("type") in ("Succeeded", "Failed") and c.get("status") == "True"
            for c in (body.get("status") or {}).get("conditions") or ()
        )

    def _released(self, name: str) -> bool:
        return not ((self.ptj_body[name].get("spec") or {}).get("runPolicy") or {}).get("suspend")

    def _check(self, job: str, now: float) -> None:
        live = sorted(n for n in self.by_job[job] if self._released(n) and not self._ended(n))
        if len(live) > 1:
            self.violations.append({"job": job, "released": live, "at": now})

    def pytorchjob(self, obj: dict[str, Any], now: float) -> None:
        meta = obj["metadata"]
        name = meta["name"]
        job = (meta.get("labels") or {}).get(LABEL_JOB, name)
        self.created.setdefault(name, now)
        self.ptj_job[name] = job
        self.by_job[job].add(name)
        self.ptj_body[name] = {"metadata": meta, "spec": obj.get("spec"), "status": obj.get("status")}
        if self._released(name):
            self.released.setdefault(name, now)
        self.events += 1
        self._check(job, now)
        self.changed.set()

    def pod(self, obj: dict[str, Any], now: float) -> None:
        meta = obj["metadata"]
        owner = (meta.get("labels") or {}).get(KUBEFLOW_JOB)
        if not owner:
            return
        self.pods[meta["name"]] = {
            "owner": owner,
            "node": (obj.get("spec") or {}).get("nodeName"),
            "phase": (obj.get("status") or {}).get("phase"),
            "uid": meta["uid"],
            "deleting": bool(meta.get("deletionTimestamp")),
        }
        if disrupted(obj):
            self.failed.setdefault(owner, now)
        if preempted(obj):
            self.preempted.setdefault(owner, now)
        self.changed.set()

    def pytorchjob_deleted(self, obj: dict[str, Any], now: float) -> None:
        name = obj["metadata"]["name"]
        if name in self.ptj_body:
            self.ptj_body[name]["metadata"] = {**obj["metadata"], "deletionTimestamp": "deleted"}

    def pod_deleted(self, obj: dict[str, Any], now: float) -> None:
        self.pods.pop(obj["metadata"]["name"], None)

    def dispatchjob(self, obj: dict[str, Any], now: float) -> None:
        self.dispatchjobs.setdefault(obj["metadata"]["name"], now)
        self.changed.set()

    def peer_pod(self, obj: dict[str, Any], now: float) -> None:
        meta = obj["metadata"]
        job = (meta.get("labels") or {}).get(PEER_JOB)
        if not job:
            return
        uid = meta["uid"]
        if uid not in self.peer_pod_seen:
            self.peer_pod_seen[uid] = now
            self.peer_pods[job].append(uid)
            self.peer_pod_name[uid] = meta["name"]
        self.peer_pod_phase[uid] = (obj.get("status") or {}).get("phase") or ""
        if disrupted(obj):
            self.peer_pod_failed.setdefault(uid, now)
        self.changed.set()

    def next_of(self, ptj: str) -> str | None:
        """The job's PyTorchJob after ``ptj`` (names end in ``-<submission>``)."""
        stem, _, n = ptj.rpartition("-")
        following = f"{stem}-{int(n) + 1}"
        return following if following in self.created else None

    def latest(self, job: str) -> str:
        return max(self.by_job[job], key=lambda n: int(n.rpartition("-")[2]))

    async def until(self, predicate: Callable[[], bool], what: str, within: float) -> float:
        await wait_until(self, predicate, what, within)
        return time.time()


class Operator:
    """The operator process, started as a user would, from a source tree."""

    def __init__(
        self, identity: Path, work: Path, tree: Path, no_events: bool, flags: Sequence[str] = ()
    ) -> None:
        self.identity, self.work, self.tree, self.no_events = identity, work, tree, no_events
        self.flags = tuple(flags)
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.log: Path = work / "operator-0.log"
        self.starts = 0
        self.started_at = 0.0

    def start(self) -> None:
        self.port = free_port()
        self.log = self.work / f"operator-{self.starts}.log"
        self.starts += 1
        # A tree from before the operator's package was named dispatch._controller has dispatch._kube.
        named = "_controller" if (self.tree / "operator" / "dispatch" / "_controller").is_dir() else "_kube"
        argv = [sys.executable, "-m", f"dispatch.{named}", f"--kubeconfig={self.identity}"]
        argv += [f"--namespace={NAMESPACE}", "--log-level=INFO", f"--metrics-port={self.port}"]
        argv += ["--metrics-addr=127.0.0.1", *(["--no-events"] if self.no_events else []), *self.flags]
        env = {**os.environ, "PYTHONPATH": str(self.tree / "operator")}
        self.started_at = time.time()
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.tree, env=env, start_new_session=True
            )

    def stop(self) -> float:
        """SIGTERM and wait; returns the seconds it took to exit."""
        if self.proc is None or self.proc.poll() is not None:
            return 0.0
        t0 = time.monotonic()
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        return round(time.monotonic() - t0, 2)

    def alive(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError(f"the operator exited; log {self.log}")

    def rss_mib(self) -> float:
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
        raise RuntimeError("no VmRSS")

    def sockets(self) -> int:
        """The operator's open sockets (its API connections, the metrics and webhook listeners)."""
        assert self.proc is not None
        fds = Path(f"/proc/{self.proc.pid}/fd")
        return sum(1 for fd in fds.iterdir() if os.readlink(fd).startswith("socket:"))

    def cpu_seconds(self) -> float:
        assert self.proc is not None
        return cpu(self.proc.pid)

    def metrics_text(self) -> str:
        """The operator's ``/metrics`` page ("" when it does not answer)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
                return str(r.read().decode())
        except OSError:
            return ""

    def requests(self) -> Counter[str]:
        """The operator's own request counter (dispatch_api_requests_total) by verb and code."""
        out = Counter[str]()
        for line in self.metrics_text().splitlines():
            if line.startswith("dispatch_api_requests_total{"):
                labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
                value = float(line.rsplit(" ", 1)[1])
                out[f"{labels.get('verb')} {labels.get('code')}"] += int(value)
        return out

    def events_dropped(self) -> int:
        """The operator's ``dispatch_events_dropped_total``, summed over its reasons."""
        return sum(
            int(float(line.rsplit(" ", 1)[1]))
            for line in self.metrics_text().splitlines()
            if line.startswith("dispatch_events_dropped_total{")
        )

    def synced(self) -> tuple[float, int] | None:
        """(seconds after start, jobs) from the operator's own line, if it wrote one."""
        for line in self.log.read_text(errors="replace").splitlines():
            m = SYNCED.search(line)
            if m:
                found = re.search(r"in ([0-9.]+) ?s", line)
                return (float(found.group(1)) if found else -1.0), int(m.group(1))
        return None


def held_lines(path: Path) -> list[str]:
    """--hold: the lines of ``path`` so far (none while it does not exist)."""
    try:
        return [line.strip() for line in path.read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        return []


def requests_delta(after: Counter[str], before: Counter[str]) -> dict[str, int]:
    """Requests other than watches, and 409s, between two reads of the counter."""
    diff = {k: after[k] - before.get(k, 0) for k in after}
    return {
        "requests": sum(v for k, v in diff.items() if not k.startswith("watch ")),
        "conflicts_409": sum(v for k, v in diff.items() if k.endswith(" 409")),
    }


def writes_summary(events: Iterable[dict[str, Any]]) -> dict[str, Any]:
    kinds = Counter[str]()
    codes = Counter[int]()
    for e in events:
        ref = e.get("objectRef") or {}
        sub = f"/{ref['subresource']}" if ref.get("subresource") else ""
        kinds[f"{e['verb']} {ref.get('resource', '?')}{sub}"] += 1
        codes[int((e.get("responseStatus") or {}).get("code") or 0)] += 1
    return {"total": sum(kinds.values()), "by_kind": dict(sorted(kinds.items())), "codes": dict(codes)}


SCHEDULER_USER = "system:kube-scheduler"
POD_OF = re.compile(r"^(?P<job>.+)-(?:master|worker)-\d+$")
"""A training-operator pod's name: its PyTorchJob's, then the replica type and index."""


def audit_time(event: dict[str, Any], stage: str = "stageTimestamp") -> float:
    """When the API server finished answering (``stageTimestamp``, microseconds; or another of the
    event's times, ``requestReceivedTimestamp``), as epoch seconds."""
    return dt.datetime.fromisoformat(str(event[stage]).replace("Z", "+00:00")).timestamp()


def scheduler_failures(events: Iterable[dict[str, Any]]) -> dict[str, float]:
    """Each PyTorchJob's failure on the API server's clock: kube-scheduler's first write on its pod
    after the audit mark (the ``DisruptionTarget`` it patches in before it deletes the pod)."""
    failed: dict[str, float] = {}
    for e in events:
        ref = e.get("objectRef") or {}
        if (e.get("user") or {}).get("username") == SCHEDULER_USER and ref.get("resource") == "pods":
            match = POD_OF.match(ref.get("name") or "")
            if match:
                failed.setdefault(match["job"], audit_time(e))
    return failed


class WatchProbe:
    """``kubectl get pods --watch`` beside the burst: when a Go client of the API server's own make
    is told of each pod's ``DisruptionTarget``, against when the API server wrote it (the audit
    log). It tells the API server's watch lag from the lag of dispatch's (or this bench's) own
    processing: the operator cannot stop a preempted object before its watch says so."""

    TEMPLATE = '{.metadata.name}{" "}{.status.conditions[?(@.type=="DisruptionTarget")].status}{"\\n"}'
    CACHE_RV = re.compile(r'^apiserver_watch_cache_resource_version\{group="",resource="pods"\} (\S+)$', re.M)
    ETCD_REV = re.compile(r"^etcd_debugging_mvcc_current_revision (\S+)$", re.M)
    SLOW = re.compile(r"^etcd_debugging_mvcc_slow_watcher_total (\S+)$", re.M)

    def __init__(self, kubectl: Sequence[str], namespace: str, etcd_url: str = "") -> None:
        self.kubectl = list(kubectl)
        # -v=6 logs each request once its answer's headers are in: the watch's tells when the list
        # kubectl takes first is over, so the probe's figures never include kubectl's own start-up.
        self.argv = [
            *kubectl,
            "get",
            "pods",
            "-n",
            namespace,
            "--watch-only",
            f"-o=jsonpath={self.TEMPLATE}",
            "-v=6",
        ]
        self.etcd_url = etcd_url
        self.seen: dict[str, float] = {}
        self.lines = 0
        self.samples: list[tuple[float, float, float, float]] = []
        """(time, etcd's revision, the API server's pods watch cache revision, etcd's slow watchers)."""
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._sampler: asyncio.Task[None] | None = None
        self._log: asyncio.Task[None] | None = None
        self._watching = asyncio.Event()
        self._last_log: deque[str] = deque(maxlen=3)
        self.list_seconds = 0.0
        """From kubectl's start to its watch's answer: its list of every pod of the namespace."""

    async def start(self, wait_s: float = 300.0) -> None:
        """Start kubectl and return once its watch has begun (its list taken), before the burst."""
        t0 = time.monotonic()
        self._proc = await asyncio.create_subprocess_exec(
            *self.argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        self._reader = asyncio.create_task(self._read())
        self._log = asyncio.create_task(self._read_log())
        watching = asyncio.create_task(self._watching.wait())
        await asyncio.wait({watching, self._log}, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
        if not self._watching.is_set():  # kubectl ended (its log closed) or took too long
            watching.cancel()
            await self.stop()
            tail = " | ".join(self._last_log)
            raise RuntimeError(f"kubectl's pod watch had not begun within {wait_s:.0f} s: {tail}")
        self.list_seconds = time.monotonic() - t0
        if self.etcd_url:
            self._sampler = asyncio.create_task(self._sample())

    async def _read_log(self) -> None:
        """Drain kubectl's log (a full pipe would stop it) and mark its watch's first answer."""
        assert self._proc is not None
        assert self._proc.stderr is not None
        async for raw in self._proc.stderr:
            line = raw.decode(errors="replace").strip()
            self._last_log.append(line)
            if "watch=true" in line:
                self._watching.set()

    def _revisions(self) -> tuple[float, float, float, float] | None:
        """etcd's current revision, then the pods watch cache's: where the pods' events wait between
        etcd and every client. Each /metrics page read once (blocking: run in a thread)."""
        with urllib.request.urlopen(f"{self.etcd_url}/metrics", timeout=5) as r:
            etcd = r.read().decode()
        now = time.time()
        apiserver = subprocess.run(
            [*self.kubectl, "get", "--raw", "/metrics"], capture_output=True, check=True, timeout=10
        ).stdout.decode()
        rev, cache, slow = self.ETCD_REV.search(etcd), self.CACHE_RV.search(apiserver), self.SLOW.search(etcd)
        if rev is None or cache is None:
            return None
        return now, float(rev[1]), float(cache[1]), float(slow[1]) if slow is not None else 0.0

    async def _sample(self) -> None:
        while True:
            with contextlib.suppress(Exception):
                sample = await asyncio.to_thread(self._revisions)
                if sample is not None:
                    self.samples.append(sample)
            await asyncio.sleep(2)

    async def _read(self) -> None:
        assert self._proc is not None
        assert self._proc.stdout is not None
        async for raw in self._proc.stdout:
            now = time.time()
            self.lines += 1
            name, _, disrupted = raw.decode().strip().partition(" ")
            match = POD_OF.match(name)
            if match and disrupted == "True":
                self.seen.setdefault(match["job"], now)

    async def stop(self) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampler
        if self._proc is not None and self._proc.returncode is None:
            self._proc.terminate()
            await self._proc.wait()
        for task in (self._reader, self._log):
            if task is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    def lag(self, failed: dict[str, float], victims: Iterable[str]) -> dict[str, Any]:
        """API server -> kubectl, per victim, in ms."""
        lags = [(self.seen[v] - failed[v]) * 1000 for v in victims if v in self.seen and v in failed]
        return {
            "lines": self.lines,
            "kubectl_list_seconds": round(self.list_seconds, 2),
            "victims_seen": len(lags),
            "apiserver_to_kubectl_ms": stats(lags),
            **self.cache_lag(),
        }

    def cache_lag(self) -> dict[str, Any]:
        """How far the API server's pods watch cache was behind etcd at each sample: in revisions,
        and in seconds since etcd had passed the cache's revision (2 s resolution). The cache's
        revision moves only with pod events, so this reads true only while pods are written all
        the time, as in the burst; at a quiet moment it grows with other kinds' writes."""
        if not self.samples:
            return {}
        behind, seconds = [], []
        for t, rev, cache, _ in self.samples:
            behind.append(rev - cache)
            passed = next((ts for ts, r, _, _ in self.samples if r > cache), t)
            seconds.append(max(t - passed, 0.0))
        return {
            "cache_samples": len(self.samples),
            "pods_cache_behind_etcd_revisions_max": max(behind),
            "pods_cache_behind_etcd_s_max": round(max(seconds), 1),
            "etcd_slow_watchers_max": max(sample[3] for sample in self.samples),
        }


def server_clock(
    events: Iterable[dict[str, Any]], victims: Iterable[str], next_of: Callable[[str], str | None]
) -> dict[str, Any]:
    """The mass preemption on the API server's own clock (its audit log): from kube-scheduler's
    first write on each victim's pod (the ``DisruptionTarget`` condition it patches in before it
    deletes the pod: the failure visible on the API server; a running pod gets no other write from
    it) to the operator's first patch of the victim's next PyTorchJob (the release: it is created
    held). This process's watches see both later than the API server wrote them, and its pod watch,
    the busier, lags more while a thousand pods go: without a write limit that lag is larger than
    the recovery itself (a negative median by the watches' clock).

    Split at the operator's first patch of the victim's own PyTorchJob after the failure (the
    stop): the failure -> the stop is how soon the operator learns of it, the stop -> the release
    how long its writes for the next submission take. And the latency of the operator's writes in
    that window (received -> answered): where the API server is the bottleneck, it grows."""
    events = list(events)
    failed = scheduler_failures(events)
    patched: dict[str, list[float]] = defaultdict(list)
    writes: list[tuple[float, float]] = []
    for e in events:
        ref, user = e.get("objectRef") or {}, (e.get("user") or {}).get("username")
        if user == OPERATOR_USER:
            if e.get("requestReceivedTimestamp"):
                writes.append((audit_time(e, "requestReceivedTimestamp"), audit_time(e)))
            if e.get("verb") == "patch" and ref.get("resource") == "pytorchjobs":
                patched[ref.get("name") or ""].append(audit_time(e))
    released = {name: times[0] for name, times in patched.items()}
    pairs = [(v, failed[v], released[n]) for v in victims if v in failed and (n := next_of(v)) in released]
    if not pairs:
        return {}
    stops = [
        (f, stop, r)
        for v, f, r in pairs
        if (stop := next((t for t in patched.get(v, ()) if t >= f), None)) is not None and stop <= r
    ]
    start, end = min(f for _, f, _ in pairs), max(r for _, _, r in pairs)
    latency = [(done - got) * 1000 for got, done in writes if start <= got <= end]
    return {
        "victims_timed": len(pairs),
        "failure_to_released_ms": stats([(r - f) * 1000 for _, f, r in pairs]),
        "failure_to_stop_ms": stats([(stop - f) * 1000 for f, stop, _ in stops]),
        "stop_to_released_ms": stats([(r - stop) * 1000 for _, stop, r in stops]),
        "operator_write_latency_ms": stats(latency),
        "first_to_last_failure_s": round(max(f for _, f, _ in pairs) - min(f for _, f, _ in pairs), 2),
        "last_failure_to_all_released_s": round(max(r for _, _, r in pairs) - max(f for _, f, _ in pairs), 2),
    }


JOB_CONTROLLER_USER = "system:serviceaccount:kube-system:job-controller"


def peer_server_clock(events: Iterable[dict[str, Any]], victims: Iterable[str]) -> dict[str, Any]:
    """The peer's replacements on the API server's clock, as :func:`server_clock` times dispatch's:
    from kube-scheduler's first status patch on each victim pod (its ``DisruptionTarget``) to the
    Job controller's creates of the replacement pods. Those creates name no pod in the audit log
    (the controller uses ``generateName``, and the name is given after the request is audited), so
    the tail is exact and the per-Job figure pairs the k-th failure with the k-th create: the
    same distribution where the controller replaces in the order it learns, a bound otherwise.
    ``victims``: the preempted pods' names (kube-scheduler also patches the status of the hogs and
    of replacements it cannot place yet)."""
    named = set(victims)
    failed: dict[str, float] = {}
    created: list[float] = []
    for e in events:
        ref, user = e.get("objectRef") or {}, (e.get("user") or {}).get("username")
        if ref.get("namespace") != PEER_NAMESPACE or ref.get("resource") != "pods":
            continue
        if user == SCHEDULER_USER and e.get("verb") == "patch" and ref.get("name") in named:
            failed.setdefault(ref.get("name") or "", audit_time(e))
        elif (
            user == JOB_CONTROLLER_USER
            and e.get("verb") == "create"
            and not ref.get("subresource")
            and (e.get("responseStatus") or {}).get("code") == 201
        ):
            created.append(audit_time(e))
    failures = sorted(failed.values())
    creates = sorted(t for t in created if failures and t >= failures[0])
    if not creates:
        return {}
    return {
        "victims_timed": len(failures),
        "replacements_created": len(creates),
        "failure_to_replacement_ms_paired_in_order": stats(
            [(c - f) * 1000 for f, c in zip(failures, creates, strict=False)]
        ),
        "first_to_last_failure_s": round(failures[-1] - failures[0], 2),
        "last_failure_to_all_replaced_s": round(creates[-1] - failures[-1], 2),
    }


def peer_job(name: str) -> dict[str, Any]:
    """batch/v1 Job at its fastest replacement setting: a disrupted pod is ignored (not counted
    against backoffLimit) and replaced."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": PEER_NAMESPACE},
        "spec": {
            "backoffLimit": 0,
            "podFailurePolicy": {
                "rules": [
                    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
                ]
            },
            "template": {
                # the lab's kwok completes a Job's pod after this delay (default 1 s): it must run on
                "metadata": {"annotations": {"pod-complete.stage.kwok.x-k8s.io/delay": "240h"}},
                "spec": {
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 0,
                    "tolerations": [PEER_TOLERATION],
                    "nodeSelector": {PEER_TAINT: "true"},
                    "containers": [
                        {
                            "name": "train",
                            "image": "pytorch/pytorch:2.4",
                            "command": ["torchrun", "train.py"],
                            "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "1"}},
                        }
                    ],
                },
            },
        },
    }


def hog(name: str, namespace: str, cpu: int, *, peer: bool = False) -> dict[str, Any]:
    """A pod of the higher PriorityClass that needs a whole node: kube-scheduler preempts every
    job pod there at once (one scheduling cycle per node: with one hog per victim the scheduler
    needed minutes for 200, most of it hogs waiting in its backoff queue)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"bench.dispatch.dev/hog": "true"}},
        "spec": {
            "priorityClassName": HIGH_PRIORITY,
            "terminationGracePeriodSeconds": 0,
            "tolerations": [PEER_TOLERATION] if peer else [],
            "nodeSelector": {PEER_TAINT: "true"} if peer else {},
            "containers": [
                {"name": "hog", "image": "lab.invalid/hog:1", "resources": {"requests": {"cpu": str(cpu)}}}
            ],
        },
    }


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.n: int = args.jobs
        self.m: int = min(args.preempt, self.n)
        self.slots: int = args.slots
        self.work = Path(tempfile.mkdtemp(prefix="dispatch-scale-"))
        self.lab = Lab(self.work / "lab", nodes=0, start_timeout=300)
        if args.apiserver_profile is not None:
            # The lab runs it with --profiling=false (tests/support/controlplane.py); the last flag wins.
            self.lab.cp.extra_apiserver_args.append("--profiling=true")
        self.world = World()
        self.result: dict[str, Any] = {"jobs": self.n, "preempt": self.m, "slots_per_node": self.slots}
        self.custom: CustomObjectsApi | None = None
        self.kubectl: list[str] = []
        self.operator: Operator | None = None
        self.nodes: list[str] = []

    def say(self, text: str) -> None:
        """One phase's line, with the invariant monitor's tally so far; the JSON is rewritten too,
        so that a run stopped in a later phase keeps what the earlier ones measured."""
        w = self.world
        tally = f"monitor: {w.events} PyTorchJob events checked, {len(w.violations)} violations"
        print(f"{time.strftime('%H:%M:%S')} [load {load()}] {text} [{tally}]", file=sys.stderr, flush=True)
        if self.args.json is not None:
            self.result["monitor_so_far"] = {"events_checked": w.events, "violations": len(w.violations)}
            self.args.json.write_text(json.dumps(self.result, indent=1, default=str) + "\n")

    # ---- set-up ---------------------------------------------------------------------------------

    def add_nodes(self, prefix: str, count: int, *, taint: str = "") -> list[str]:
        names = [f"{prefix}{i}" for i in range(count)]
        labels = {PEER_TAINT: "true"} if taint else {}
        docs = [
            node_manifest(n, cpu=str(self.slots), pods=str(self.slots + 10), labels=labels) for n in names
        ]
        for doc in docs if taint else ():
            doc["spec"] = {"taints": [{"key": taint, "value": "true", "effect": "NoSchedule"}]}
        self.run_kubectl(
            ["create", "-f", "-"], json.dumps({"apiVersion": "v1", "kind": "List", "items": docs})
        )

        def ready() -> bool:
            nodes = self.lab.request("GET", "/api/v1/nodes").get("items") or []
            up = {
                n["metadata"]["name"]
                for n in nodes
                if any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in (n.get("status") or {}).get("conditions") or ()
                )
            }
            return set(names) <= up

        self.lab.wait(f"{count} nodes Ready", ready, 300, interval=1.0)
        return names

    def cordon(self, names: Iterable[str], on: bool) -> None:
        for name in names:
            self.lab.request(
                "PATCH",
                f"/api/v1/nodes/{name}",
                {"spec": {"unschedulable": on or None}},
                content_type="application/merge-patch+json",
            )

    def run_kubectl(self, argv: Sequence[str], stdin: str | None = None) -> str:
        out = subprocess.run(
            [*self.kubectl, *argv], input=stdin.encode() if stdin else None, check=True, capture_output=True
        )
        return out.stdout.decode()

    async def apply(self, docs: list[dict[str, Any]], processes: int = 4) -> None:
        """``kubectl apply --server-side`` of DOCS, split over a few kubectl processes."""
        chunks = [docs[i::processes] for i in range(processes) if docs[i::processes]]
        files = []
        for i, chunk in enumerate(chunks):
            path = self.work / f"apply-{time.monotonic_ns()}-{i}.json"
            path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": chunk}))
            files.append(path)
        procs = [
            await asyncio.create_subprocess_exec(
                *self.kubectl,
                "apply",
                "--server-side",
                "-f",
                str(f),
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
            )
            for f in files
        ]
        for p in procs:
            _, err = await p.communicate()
            if p.returncode:
                raise RuntimeError(f"kubectl apply failed: {err.decode()[-2000:]}")

    def tune(self) -> None:
        """The lab's binaries, with the bench's client flags for the training operator and
        kube-controller-manager: a wrapper script found first (the env var) execs the real binary
        with them, so the lab starts them as ever (tests/support/lab.py is unchanged)."""
        real = resolve_lab_binaries()
        flags = {
            "DISPATCH_TRAINING_OPERATOR": (real.training_operator, self.args.training_operator_flags),
            "DISPATCH_KUBE_CONTROLLER_MANAGER": (real.kube_controller_manager, self.args.kcm_flags),
        }
        (self.work / "bin").mkdir(exist_ok=True)
        for key, (binary, extra) in flags.items():
            wrapper = self.work / "bin" / Path(binary).name
            wrapper.write_text(f'#!/bin/sh\nexec {shlex.quote(binary)} {extra} "$@"\n')
            wrapper.chmod(0o755)
            os.environ[key] = str(wrapper)
        self.result["component_flags"] = {
            "training-operator": self.args.training_operator_flags,
            "kube-controller-manager": self.args.kcm_flags,
        }

    def setup(self) -> None:
        self.tune()
        self.lab.start()
        self.say(f"lab up in {self.lab.start_seconds:.1f}s")
        self.kubectl = [resolve_binaries().kubectl, f"--kubeconfig={self.lab.kubeconfig}"]
        tree = Path(self.args.operator_tree).resolve() if self.args.operator_tree else REPO
        crd = str(tree / "crds/dispatch.dev_dispatchjobs.yaml")  # the operator's own version of it
        self.run_kubectl(["apply", "--server-side", "-f", crd])
        self.lab.wait(
            "DispatchJob CRD Established",
            lambda: any(
                c.get("type") == "Established" and c.get("status") == "True"
                for c in (
                    self.lab.request(
                        "GET",
                        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/dispatchjobs.dispatch.dev",
                    ).get("status")
                    or {}
                ).get("conditions")
                or ()
            ),
            60,
        )
        for ns in (NAMESPACE, PEER_NAMESPACE, FLOOR_NAMESPACE):
            self.run_kubectl(["create", "namespace", ns])
        self.nodes = self.add_nodes("bench-node-", -(-self.n // self.slots))
        self.say(f"{len(self.nodes)} nodes of {self.slots} slots Ready")
        identity = self.lab.mint_user(OPERATOR_USER, ["system:masters"])
        flags = shlex.split(self.args.operator_flags)
        self.operator = Operator(identity, self.work, tree, self.args.no_events, flags)
        self.result["operator_flags"] = flags
        self.result["operator_tree"] = str(tree)
        stamp = tree / "COMMIT"  # write the commit there beside a git archive
        self.result["operator_commit"] = (
            stamp.read_text().strip()
            if stamp.exists()
            else subprocess.run(
                ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                capture_output=True,
                text=True,
                check=False,
            ).stdout.strip()
        )

    # ---- phases ---------------------------------------------------------------------------------

    async def wait_running(self, what: str, *, or_ended: bool = False) -> None:
        """Every job's latest PyTorchJob released and its pod Running (``or_ended``: or ended, as
        after a node-lost eviction while no operator runs to record it)."""
        w = self.world

        def all_running() -> bool:
            if len(w.by_job) < self.n:
                return False
            running = {p["owner"] for p in w.pods.values() if p["phase"] == "Running" and not p["deleting"]}
            return all(w.latest(j) in running or (or_ended and w._ended(w.latest(j))) for j in w.by_job)

        await w.until(all_running, what, 1800 + self.n * 2.0)

    async def quiet(self, seconds: float) -> None:
        assert self.operator is not None
        before = self.operator.requests()
        while True:
            await asyncio.sleep(seconds)
            after = self.operator.requests()
            if requests_delta(after, before)["requests"] == 0:
                return
            before = after
            if seconds > 30:
                return

    async def started_empty(self) -> list[dict[str, Any]]:
        """Start the operator on no jobs, note its RSS; the N DispatchJobs to apply."""
        assert self.operator is not None
        op = self.operator
        op.start()
        await asyncio.sleep(3)
        op.alive()
        await self.quiet(2)
        self.result["rss_empty_mib"] = op.rss_mib()
        return [
            dispatchjob(f"job-{i:05d}", NAMESPACE, self.args.budget, resources={"cpu": "1"})
            for i in range(self.n)
        ]

    async def creation(self) -> None:
        assert self.operator is not None
        op = self.operator
        docs = await self.started_empty()
        t0 = time.time()
        w = self.world
        if self.args.backlog:
            # The operator's own pace, not kubectl's: every DispatchJob is there before it starts.
            op.stop()
            self.say(f"applying {self.n} DispatchJobs with the operator stopped (--backlog)")
            await self.apply(docs, self.args.appliers)
            applied = time.time()
            await w.until(lambda: len(w.dispatchjobs) >= self.n, f"{self.n} DispatchJobs seen", 600)
            op.start()
            started = time.time()
        else:
            self.say(f"applying {self.n} DispatchJobs")
            await self.apply(docs, self.args.appliers)
            applied = time.time()
        await w.until(lambda: len(w.created) >= self.n, f"{self.n} first PyTorchJobs", 1800 + self.n * 2.0)
        created = sorted(w.created.values())
        first_dj = started if self.args.backlog else min(w.dispatchjobs.values())
        span = created[-1] - first_dj
        lo, hi = created[len(created) // 10], created[(len(created) * 9) // 10]
        self.result["creation"] = {
            "kubectl_apply_seconds": round(applied - t0, 1),
            "dispatchjobs_per_second": round(self.n / max(max(w.dispatchjobs.values()) - first_dj, 1e-3), 1),
            "first_submissions_per_second": round(self.n / span, 1),
            "first_submissions_per_second_10_to_90pct": round(0.8 * self.n / max(hi - lo, 1e-3), 1),
            "first_dispatchjob_to_last_created_s": round(span, 1),
            "load": load(),
        }
        self.say(f"creation: {self.result['creation']}")
        await self.wait_running(f"{self.n} jobs running")
        self.say("every job running")

    async def preloaded(self, api: ApiClient) -> None:
        """``--preload``: the first ``--slots`` jobs are created as in :meth:`creation` (the operator
        and the training operator make their objects); the others are copies of the first job's
        objects written through the API with the operator stopped, each by the field manager that
        wrote the original (the DispatchJob applied as kubectl does, its finalizer and status
        written as the operator does, the PyTorchJob released as the operator creates it, its
        Service and pod as the training operator makes them, the pod scheduled by kube-scheduler,
        the PyTorchJob's status the training operator's): the same bodies on the wire as after a
        creation, in minutes at 10,000, and the cluster quiet once every pod runs. Then the
        operator starts on all of them (its "known and decided" line is a first restart figure)."""
        assert self.operator is not None
        op, w = self.operator, self.world
        seed = min(self.slots, self.n)
        docs = await self.started_empty()
        self.say(f"--preload: applying the {seed} seed DispatchJobs")
        await self.apply(docs[:seed], self.args.appliers)
        seeds = {f"job-{i:05d}" for i in range(seed)}

        def seeded() -> bool:
            running = {p["owner"] for p in w.pods.values() if p["phase"] == "Running" and not p["deleting"]}
            return seeds <= set(w.by_job) and all(w.latest(j) in running for j in seeds)

        await w.until(seeded, f"{seed} seed jobs running", 600 + seed * 2.0)
        op.stop()

        async def decoded(call: Awaitable[Any]) -> dict[str, Any]:
            """The JSON body of a call made with _preload_content=False (the generated client
            answers None to an apply patch)."""
            response = await call
            async with response:
                return cast(dict[str, Any], json.loads(await response.read()))

        custom, core = CustomObjectsApi(api), CoreV1Api(api)
        source = "job-00000"
        templates = {
            "dj": await custom.get_namespaced_custom_object(
                "dispatch.dev", "v1alpha1", NAMESPACE, "dispatchjobs", source
            ),
            "ptj": await custom.get_namespaced_custom_object(
                KUBEFLOW, "v1", NAMESPACE, "pytorchjobs", f"{source}-1"
            ),
            "svc": await decoded(
                core.read_namespaced_service(f"{source}-1-master-0", NAMESPACE, _preload_content=False)
            ),
            "pod": await decoded(
                core.read_namespaced_pod(f"{source}-1-master-0", NAMESPACE, _preload_content=False)
            ),
        }
        texts = {k: json.dumps(v) for k, v in templates.items()}
        gate = asyncio.Semaphore(self.args.preload_parallel)
        t0, done = time.time(), 0

        def copy(key: str, name: str) -> dict[str, Any]:
            body: dict[str, Any] = json.loads(texts[key].replace(source, name))
            meta = body["metadata"]
            for drop in ("uid", "resourceVersion", "creationTimestamp", "managedFields", "generation"):
                meta.pop(drop, None)
            return body

        def rv(body: dict[str, Any]) -> str:
            return str(body["metadata"]["resourceVersion"])

        async def one(i: int) -> None:
            nonlocal done
            name = f"job-{i:05d}"
            async with gate:
                applied = await decoded(custom.patch_namespaced_custom_object(
                    "dispatch.dev", "v1alpha1", NAMESPACE, "dispatchjobs", name, docs[i],
                    field_manager="kubectl", force=True, _preload_content=False, **APPLY,
                ))  # fmt: skip
                dj = copy("dj", name)
                patched = await custom.patch_namespaced_custom_object(
                    "dispatch.dev", "v1alpha1", NAMESPACE, "dispatchjobs", name,
                    {"metadata": {"finalizers": dj["metadata"].get("finalizers") or []}},
                    field_manager=OPERATOR_FIELD_MANAGER, **MERGE,
                )  # fmt: skip
                await custom.replace_namespaced_custom_object_status(
                    "dispatch.dev", "v1alpha1", NAMESPACE, "dispatchjobs", name,
                    {**dj, "metadata": {**dj["metadata"], "resourceVersion": rv(patched)}},
                    field_manager=OPERATOR_FIELD_MANAGER,
                )  # fmt: skip
                ptj = copy("ptj", name)
                for ref in ptj["metadata"].get("ownerReferences") or ():
                    ref["uid"] = applied["metadata"]["uid"]
                ptj.pop("status", None)  # the training operator's
                created = await custom.create_namespaced_custom_object(
                    KUBEFLOW, "v1", NAMESPACE, "pytorchjobs", ptj, field_manager=OPERATOR_FIELD_MANAGER
                )
                # Its Service and pod as the training operator makes them (it may be first: 409),
                # the pod left to kube-scheduler; its own pace is minutes per thousand.
                for key in ("svc", "pod"):
                    body = copy(key, name)
                    body.pop("status", None)
                    for ref in body["metadata"].get("ownerReferences") or ():
                        ref["uid"] = created["metadata"]["uid"]
                    spec = body.get("spec") or {}
                    for drop in (
                        "nodeName",
                        *(("clusterIP", "clusterIPs") if spec.get("clusterIP") != "None" else ()),
                    ):
                        spec.pop(drop, None)
                    create = core.create_namespaced_service if key == "svc" else core.create_namespaced_pod
                    try:
                        await create(NAMESPACE, cast(Any, body), field_manager=TRAINING_FIELD_MANAGER)
                    except ApiException as e:
                        if e.status != 409:  # 409: the training operator was first
                            raise
                done += 1
                if done % 1000 == 0:
                    self.say(f"--preload: {done} of {self.n - seed} copied")

        await asyncio.gather(*(one(i) for i in range(seed, self.n)))
        copied = time.time()
        self.result["preload"] = {
            "seeded": seed,
            "copied": self.n - seed,
            "copy_seconds": round(copied - t0, 1),
            "load": load(),
        }
        self.say(f"--preload: {self.result['preload']}")
        # At load 10 and more, kwok nodes miss heartbeats and the node lifecycle controller evicts
        # their pods: those PyTorchJobs fail with no operator running, and never run again. They
        # are counted; the operator's first start records them (node-lost is no rule's cause).
        await self.wait_running(f"{self.n} jobs running or ended", or_ended=True)
        self.result["preload"]["ended_before_start"] = sum(
            1 for j in self.world.by_job if self.world._ended(self.world.latest(j))
        )
        op.start()
        started = time.time()
        while time.time() - started < 300 + self.n * 0.1 and op.synced() is None:
            await asyncio.sleep(0.25)
            op.alive()
        synced = op.synced()
        self.result["preload"]["first_start"] = {
            "known_and_decided_s": synced[0] if synced else None,
            "jobs": synced[1] if synced else None,
            "load": load(),
        }
        self.say(f"every job running; first start: {self.result['preload']['first_start']}")

    async def settled_population(self, api: ApiClient) -> None:
        """``--settled N``: N more DispatchJobs that ran and settled, as a cluster keeps them after
        months, written through the API with the operator stopped: each applied as kubectl does,
        its finalizer and its status as the operator writes them: the record of ``job-00000``, its
        outcome (succeeded) and its settle applied by the core's own ``apply``, the status by the
        codec's ``record_write`` (so ``settledAt`` is there). The operator then starts on them all
        with the live jobs (its "known and decided" line counts both)."""
        from dispatch._decide import RecordOutcome, RecordSettled, apply
        from dispatch._dispatchjob import record_from, record_write
        from dispatch._model import SUPERVISOR, Cause, CauseKind, State

        assert self.operator is not None
        op = self.operator
        op.stop()
        custom = CustomObjectsApi(api)
        source = "job-00000"
        template = await custom.get_namespaced_custom_object(
            "dispatch.dev", "v1alpha1", NAMESPACE, "dispatchjobs", source
        )
        now = dt.datetime.now(dt.UTC)
        record = record_from(template)
        done = Cause(kind=CauseKind.NONE, detail=f"PyTorchJob {source}-1 is successfully completed.")
        record = apply(record, RecordOutcome(State.SUCCEEDED, done), actor=SUPERVISOR, now=now)
        record = apply(record, RecordSettled(), actor=SUPERVISOR, now=now)
        status = record_write(
            record, previous=template["status"].get("conditions") or [], generation=1, now=now, observed={}
        )
        text = json.dumps(status)
        spec = {k: v for k, v in template["spec"].items() if k not in ("cancel", "suspend", "retry")}
        gate = asyncio.Semaphore(self.args.preload_parallel)
        t0, made = time.time(), 0

        async def one(i: int) -> None:
            nonlocal made
            name = f"settled-{i:05d}"
            metadata: dict[str, Any] = {"name": name, "namespace": NAMESPACE}
            doc: dict[str, Any] = {"apiVersion": "dispatch.dev/v1alpha1", "kind": "DispatchJob"}
            doc.update(metadata=metadata, spec=spec)
            async with gate:
                await custom.patch_namespaced_custom_object(
                    "dispatch.dev", "v1alpha1", NAMESPACE, "dispatchjobs", name, doc,
                    field_manager="kubectl", force=True, _preload_content=False, **APPLY,
                )  # fmt: skip
                patched = await custom.patch_namespaced_custom_object(
                    "dispatch.dev", "v1alpha1", NAMESPACE, "dispatchjobs", name,
                    {"metadata": {"finalizers": ["dispatch.dev/finalizer"]}},
                    field_manager=OPERATOR_FIELD_MANAGER, **MERGE,
                )  # fmt: skip
                meta = {**metadata, "resourceVersion": patched["metadata"]["resourceVersion"]}
                body: dict[str, Any] = {**doc, "metadata": meta}
                body["status"] = json.loads(text.replace(source, name))
                await custom.replace_namespaced_custom_object_status(
                    "dispatch.dev", "v1alpha1", NAMESPACE, "dispatchjobs", name, body,
                    field_manager=OPERATOR_FIELD_MANAGER,
                )  # fmt: skip
                made += 1
                if made % 5000 == 0:
                    self.say(f"--settled: {made} of {self.args.settled} written")

        await asyncio.gather(*(one(i) for i in range(self.args.settled)))
        self.result["settled_population"] = {
            "settled": self.args.settled,
            "write_seconds": round(time.time() - t0, 1),
            "load": load(),
        }
        self.say(f"--settled: {self.result['settled_population']}")
        op.start()
        started = time.time()
        while time.time() - started < 300 + (self.n + self.args.settled) * 0.01 and op.synced() is None:
            await asyncio.sleep(0.25)
            op.alive()

    async def steady(self) -> None:
        assert self.operator is not None
        op = self.operator
        await self.quiet(5)
        rss = op.rss_mib()
        self.result["rss"] = {
            "after_creation_mib": rss,
            "per_job_kib": round((rss - self.result["rss_empty_mib"]) * 1024 / self.n, 1),
            "load": load(),
        }
        self.result["idle"] = await self.idle_window(20)
        self.say(f"rss {self.result['rss']} idle {self.result['idle']}")

    async def idle_window(self, seconds: float) -> dict[str, Any]:
        assert self.operator is not None
        op = self.operator
        mark, req, cpu = self.lab.audit_mark(), op.requests(), op.cpu_seconds()
        await asyncio.sleep(seconds)
        delta = requests_delta(op.requests(), req)
        writes = len(self.lab.audit_writes(mark, user=OPERATOR_USER))
        return {
            "window_s": seconds,
            "requests_per_s": round(delta["requests"] / seconds, 2),
            "writes_per_s": round(writes / seconds, 2),
            "cpu_percent": round((op.cpu_seconds() - cpu) / seconds * 100, 1),
            "load": load(),
        }

    async def restart(self, key: str = "restart") -> None:
        assert self.operator is not None
        op = self.operator
        stopped = op.stop()
        mark = self.lab.audit_mark()
        server = self.lab.cp.pids.get("kube-apiserver")
        server_cpu = cpu(server) if server is not None else None
        op.start()
        t0 = op.started_at
        assert op.proc is not None
        self.say(f"{key}: operator pid {op.proc.pid} started from {op.tree}")
        profile = None
        if self.args.apiserver_profile is not None:
            profile = asyncio.create_task(asyncio.to_thread(self.apiserver_profile, key))
        last_change, before = time.time(), Counter[str]()
        synced: tuple[float, int] | None = None
        cpu_at_line: dict[str, float] = {}
        while time.time() - t0 < 120 + self.n * 0.1:
            await asyncio.sleep(0.25)
            op.alive()
            synced = op.synced()
            if synced is not None:
                # Both CPU figures at the line: a restart is bound by both processes' CPU where they share
                # few cores.
                cpu_at_line["operator_cpu_s"] = round(op.cpu_seconds(), 2)
                if server is not None and server_cpu is not None:
                    cpu_at_line["apiserver_cpu_s"] = round(cpu(server) - server_cpu, 2)
                break
            now = op.requests()
            if now != before:  # any request, watches too (a streamed list is one)
                last_change, before = time.time(), now
            elif now and time.time() - last_change > 30:
                break
        out: dict[str, Any] = {"stop_seconds": stopped}
        if synced is not None:
            out["known_and_decided_s"] = synced[0]
            out["known_and_decided_jobs"] = synced[1]
            out.update(cpu_at_line)
            out["seen_by_bench_s"] = round(time.time() - t0, 2)
            await asyncio.sleep(5)  # writes that would follow the line count too
        else:
            out["requests_quiet_after_s"] = round(last_change - t0, 2)
            out["note"] = "no 'known and decided' line: time until the operator's requests went quiet"
        writes = self.lab.audit_writes(mark, user=OPERATOR_USER)
        out["writes"] = writes_summary(
            w for w in writes if (w.get("objectRef") or {}).get("resource") != "leases"
        )
        counted = op.requests()
        out["requests"] = requests_delta(counted, Counter())
        out["watches"] = sum(v for k, v in counted.items() if k.startswith("watch "))
        out["rss_after_sync_mib"] = op.rss_mib()
        out["rss_per_job_kib"] = round(
            (out["rss_after_sync_mib"] - self.result["rss_empty_mib"]) * 1024 / self.n, 1
        )
        out["load"] = load()
        out["operator_tree"] = str(op.tree)
        if profile is not None:
            out["apiserver_profile"] = await profile
        self.result[key] = out
        self.say(f"{key}: {out}")

    async def settle(self, below: float, most: float = 1200.0) -> None:
        """--settle-load: wait until the one-minute load is under ``below`` (at most ``most`` s).
        Right after a preload of 10,000 the lab is busy for minutes with what the preload left to
        the others (kube-controller-manager's Endpoints and EndpointSlices for every Service the
        training operator made); what runs then measures that as much as the operator."""
        t0 = time.monotonic()
        while load() >= below and time.monotonic() - t0 < most:
            if self.operator is not None:
                self.operator.alive()  # an operator that died meanwhile stops the run here
            await asyncio.sleep(5)
        self.result["settled"] = {"waited_s": round(time.monotonic() - t0, 1), "load": load()}
        self.say(f"settled: {self.result['settled']}")

    def apiserver_profile(self, key: str) -> str:
        """--apiserver-profile: kube-apiserver's CPU profile over the restart's first seconds (its
        pprof endpoint), saved as ``<key>.pprof`` with ``go tool pprof -top``'s text beside it: where
        its CPU for the restart's lists goes, which varies from one restart to the next."""
        directory, seconds = self.args.apiserver_profile, self.args.apiserver_profile_seconds
        directory.mkdir(parents=True, exist_ok=True)
        url = f"{self.lab.server}/debug/pprof/profile?seconds={seconds}"
        ctx = self.lab.cp.admin_ssl_context()
        with urllib.request.urlopen(url, timeout=seconds + 60, context=ctx) as resp:
            data = resp.read()
        path = directory / f"{key}.pprof"
        path.write_bytes(data)
        go = shutil.which("go")
        if go is not None:
            top = subprocess.run(
                [go, "tool", "pprof", "-top", "-nodecount=60", str(path)],
                capture_output=True,
                text=True,
                check=False,
            )
            (directory / f"{key}.top.txt").write_text(top.stdout + top.stderr)
        return str(path)

    async def hold(self, path: Path, first: int) -> None:
        """Keep the lab and restart the operator from each tree named in ``path``, a line at a time
        as lines are added (``end`` goes on): A/B on one large lab without preloading it again."""
        assert self.operator is not None
        self.say(f"holding: kubeconfig {self.lab.kubeconfig}; trees to restart from, a line each, in {path}")
        done, i = 0, first
        while True:
            lines = held_lines(path)
            if done >= len(lines):
                op = self.operator
                op.alive()
                await asyncio.sleep(1)
                continue
            line, done = lines[done], done + 1
            if line == "end":
                return
            if line.startswith("apiserver "):
                binary = line.split(None, 1)[1]
                self.say(f"holding: kube-apiserver replaced by {binary}")
                await asyncio.to_thread(self.lab.cp.replace_apiserver, binary)
                self.say("holding: kube-apiserver ready")
                continue
            self.operator.tree = Path(line)  # absolute, as --restart-trees are made
            await self.restart(f"restart_{i}")
            i += 1

    async def reaction(self) -> None:
        """Preemptions one at a time, each through kube-scheduler (the lab's preempt_pod)."""
        assert self.operator is not None
        op, w = self.operator, self.world
        k = min(self.args.samples, self.n)
        jobs = [f"job-{i:05d}" for i in range(0, self.n, max(self.n // k, 1))][:k]
        assert self.custom is not None
        chain = await self.recovery_floor(self.custom, len(jobs))
        mark, req, cpu = self.lab.audit_mark(), op.requests(), op.cpu_seconds()
        latencies: list[float] = []
        created: list[float] = []
        floor: list[float] = []
        elapsed = 0.0
        for i, job in enumerate(jobs):
            t0 = time.time()
            ptj = w.latest(job)
            pod = next(p for p, v in w.pods.items() if v["owner"] == ptj and v["phase"] == "Running")
            await asyncio.to_thread(self.lab.preempt_pod, NAMESPACE, pod)
            await w.until(functools.partial(self.next_released, ptj), f"{ptj}'s next released", 120)
            after = w.next_of(ptj)
            assert after is not None
            latencies.append((w.released[after] - w.failed[ptj]) * 1000)
            created.append((w.created[after] - w.failed[ptj]) * 1000)
            elapsed += time.time() - t0
            floor.append(await chain(i))  # not counted: writes outside the operator's namespace
        await asyncio.sleep(2)
        writes = self.lab.audit_writes(mark, user=OPERATOR_USER)
        writes = [e for e in writes if (e.get("objectRef") or {}).get("resource") != "leases"]
        delta = requests_delta(op.requests(), req)
        summary = writes_summary(writes)
        self.result["reaction"] = {
            "samples": k,
            "failure_to_created_ms": stats(created),
            "failure_to_released_ms": stats(latencies),
            "floor_four_writes_in_a_row_ms": stats(floor),
            "ratio_median_to_floor": round(statistics.median(latencies) / statistics.median(floor), 2),
            "writes_per_recovery": round(summary["total"] / k, 2),
            "writes_by_kind_per_recovery": {kk: round(v / k, 2) for kk, v in summary["by_kind"].items()},
            "requests_per_recovery": round(delta["requests"] / k, 2),
            "conflicts_409_per_recovery": round(delta["conflicts_409"] / k, 2),
            "cpu_ms_per_recovery": round((op.cpu_seconds() - cpu) * 1000 / k, 1),
            "wall_s": round(elapsed, 1),
            "load": load(),
        }
        self.say(f"reaction: {self.result['reaction']}")
        await self.wait_running("every job running again after the reaction samples")

    def next_released(self, ptj: str) -> bool:
        return (self.world.next_of(ptj) or "") in self.world.released

    async def create_all(self, core: CoreV1Api, bodies: list[dict[str, Any]], parallel: int = 16) -> None:
        gate = asyncio.Semaphore(parallel)

        async def one(body: dict[str, Any]) -> None:
            async with gate:
                await core.create_namespaced_pod(body["metadata"]["namespace"], cast(Any, body))

        await asyncio.gather(*(one(b) for b in bodies))

    async def delete_hogs(self, core: CoreV1Api, namespace: str) -> None:
        await core.delete_collection_namespaced_pod(
            namespace, label_selector="bench.dispatch.dev/hog=true", grace_period_seconds=0
        )

    def victim_nodes(self, pool: Sequence[str], owner_running: Callable[[str], int]) -> list[str]:
        want = -(-self.m // self.slots)
        full = [n for n in pool if owner_running(n) == self.slots]
        if len(full) < want:
            raise RuntimeError(f"only {len(full)} full nodes of {len(pool)}; need {want}")
        return full[:want]

    async def mass(self, core: CoreV1Api) -> None:
        assert self.operator is not None
        op, w = self.operator, self.world

        def running_on(node: str) -> int:
            return sum(
                1
                for p in w.pods.values()
                if p["node"] == node
                and p["phase"] == "Running"
                and not p["deleting"]
                and p["owner"] not in w.failed
            )

        victims_nodes = self.victim_nodes(self.nodes, running_on)
        self.cordon([n for n in self.nodes if n not in victims_nodes], True)
        before = set(w.preempted)
        mark, req, cpu = self.lab.audit_mark(), op.requests(), op.cpu_seconds()
        dropped = op.events_dropped()
        peaks = {"rss_peak_mib": op.rss_mib(), "sockets_peak": op.sockets()}

        async def sample() -> None:
            # The burst's peak, not only what is left after it: the memory target holds throughout.
            while True:
                await asyncio.sleep(0.25)
                peaks["rss_peak_mib"] = max(peaks["rss_peak_mib"], op.rss_mib())
                peaks["sockets_peak"] = max(peaks["sockets_peak"], op.sockets())

        sampler = asyncio.create_task(sample())
        probe = WatchProbe(self.kubectl, NAMESPACE, self.lab.cp.etcd_url) if self.args.watch_probe else None
        if probe is not None:
            await probe.start()  # returns once its list is taken (--watch-only prints no list)
        try:
            t0 = time.time()
            await self.create_all(
                core, [hog(f"hog-{i:05d}", NAMESPACE, self.slots) for i in range(self.m // self.slots)]
            )
            hogs_created = time.time()

            def victims() -> list[str]:
                # Preempted by kube-scheduler only: on a loaded lab kwok's heartbeats for a node can
                # lapse, and the pods the taint manager then evicts end their jobs `node-lost`, which
                # the bench's rule does not resubmit (a settled 10,000-job run waited for them).
                return [p for p in w.preempted if p not in before]

            def recovered() -> bool:
                v = victims()
                return len(v) >= self.m and all((w.next_of(p) or "") in w.released for p in v)

            await w.until(recovered, f"{self.m} preempted jobs released again", 1800 + self.m * 2.0)
            done = time.time()
            await asyncio.sleep(2)
        finally:
            sampler.cancel()
            if probe is not None:
                await probe.stop()
        v = victims()
        writes = [
            e
            for e in self.lab.audit_writes(mark, user=OPERATOR_USER)
            if (e.get("objectRef") or {}).get("resource") != "leases"
        ]
        summary = writes_summary(writes)
        delta = requests_delta(op.requests(), req)
        per_job = [(w.released[w.next_of(p) or ""] - w.failed[p]) * 1000 for p in v]
        last_failure = max(w.failed[p] for p in v)
        self.result["mass_preemption"] = {
            "preempted": len(v),
            "hogs_created_s": round(hogs_created - t0, 1),
            "first_to_last_failure_s": round(last_failure - min(w.failed[p] for p in v), 1),
            "hogs_start_to_all_released_s": round(done - t0, 1),
            "last_failure_to_all_released_s": round(done - last_failure, 2),
            "failure_to_released_ms": stats(per_job),
            "writes_per_recovery": round(summary["total"] / len(v), 2),
            "writes_by_kind_per_recovery": {k: round(c / len(v), 2) for k, c in summary["by_kind"].items()},
            "write_codes": summary["codes"],
            "requests_per_recovery": round(delta["requests"] / len(v), 2),
            "conflicts_409": delta["conflicts_409"],
            "cpu_ms_per_recovery": round((op.cpu_seconds() - cpu) * 1000 / len(v), 1),
            "rss_after_mib": op.rss_mib(),  # the memory target is read after the busiest phase too
            **peaks,
            "server_clock": server_clock(audited := self.lab.audit_writes(mark), v, w.next_of),
            **({"watch_probe": probe.lag(scheduler_failures(audited), v)} if probe is not None else {}),
            "load": load(),
        }
        self.say(f"mass preemption: {self.result['mass_preemption']}")
        events = await self.events_after(mark, done, len(v), dropped)
        self.result["mass_preemption"]["events"] = events
        self.say(f"the mass preemption's Events: {events}")
        await self.delete_hogs(core, NAMESPACE)
        self.cordon(self.nodes, False)
        # The client's connections opened for the burst close once idle (aiohttp's keep-alive, 15 s):
        # what RSS gives back then, and how many sockets stay.
        await self.quiet(30)
        quiet = {"rss_after_quiet_mib": op.rss_mib(), "sockets_after_quiet": op.sockets()}
        self.result["mass_preemption"].update(quiet)
        self.say(f"after the mass preemption, quiet: {quiet}")

    async def events_after(self, mark: int, done: float, recoveries: int, dropped: int) -> dict[str, Any]:
        """The operator's Events since ``mark`` once it has stopped posting them (no new one for 5 s,
        120 s at most): per recovery, how many came after every job was released (``done``), the
        last one's delay after ``done``, and how many it dropped."""
        op = self.operator
        assert op is not None
        posted: list[float] = []
        deadline = time.time() + 120
        while True:
            posted = [
                audit_time(e)
                for e in self.lab.audit_writes(mark, user=OPERATOR_USER, resource="events")
                if e.get("verb") == "create"
            ]
            if time.time() > deadline or (posted and time.time() - max(posted) > 5):
                break
            await asyncio.sleep(2)
        after = [t for t in posted if t > done]
        return {
            "per_recovery": round(len(posted) / max(recoveries, 1), 2),
            "after_all_released_per_recovery": round(len(after) / max(recoveries, 1), 2),
            "last_after_all_released_s": round(max(after) - done, 1) if after else 0.0,
            "dropped": op.events_dropped() - dropped,
        }

    async def peer(self, core: CoreV1Api) -> None:
        w = self.world
        self.add_nodes("bench-peer-node-", -(-self.m // self.slots), taint=PEER_TAINT)
        await self.apply([peer_job(f"peer-{i:05d}") for i in range(self.m)])

        def running() -> bool:
            return sum(1 for p in w.peer_pod_phase.values() if p == "Running") >= self.m

        await w.until(running, f"{self.m} peer pods Running", 1800 + self.m * 2.0)
        self.say("peer Jobs running")
        await asyncio.sleep(3)
        mark = self.lab.audit_mark()
        t0 = time.time()
        await self.create_all(
            core,
            [hog(f"hog-{i:05d}", PEER_NAMESPACE, self.slots, peer=True) for i in range(self.m // self.slots)],
        )

        def victims() -> dict[str, str]:
            return {
                job: uids[0] for job, uids in w.peer_pods.items() if uids and uids[0] in w.peer_pod_failed
            }

        def replaced() -> bool:
            v = victims()
            return len(v) >= self.m and all(len(w.peer_pods[j]) > 1 for j in v)

        await w.until(replaced, f"{self.m} peer Jobs with a replacement pod", 1800 + self.m * 2.0)
        done = time.time()
        v = victims()
        failures = [w.peer_pod_failed[uid] for uid in v.values()]
        per_job = [
            (w.peer_pod_seen[w.peer_pods[j][1]] - w.peer_pod_failed[uid]) * 1000 for j, uid in v.items()
        ]
        self.result["peer"] = {
            "controller": f"kube-controller-manager's Job controller, {self.args.kcm_flags}",
            "preempted": len(v),
            "first_to_last_failure_s": round(max(failures) - min(failures), 1),
            "hogs_start_to_all_replaced_s": round(done - t0, 1),
            "last_failure_to_all_replaced_s": round(done - max(failures), 2),
            "failure_to_replacement_ms": stats(per_job),
            "server_clock": peer_server_clock(
                self.lab.audit_writes(mark, namespace=PEER_NAMESPACE),
                (w.peer_pod_name[uid] for uid in v.values()),
            ),
            "load": load(),
        }
        self.say(f"peer: {self.result['peer']}")
        await self.delete_hogs(core, PEER_NAMESPACE)
        await asyncio.to_thread(
            self.run_kubectl, ["delete", "jobs", "--all", "-n", PEER_NAMESPACE, "--wait=false"]
        )

    async def floor(self, custom: CustomObjectsApi) -> None:
        assert self.operator is not None
        self.result["operator_stop_s"] = self.operator.stop()
        names = [f"floor-{i:05d}" for i in range(self.m)]
        docs = [dispatchjob(n, FLOOR_NAMESPACE, 1) for n in names]
        await self.apply(docs)
        out: dict[str, Any] = {}
        for parallel in (1, 8):
            gate = asyncio.Semaphore(parallel)

            async def one(name: str, gate: asyncio.Semaphore = gate, parallel: int = parallel) -> None:
                async with gate:
                    await cast(Any, custom).patch_namespaced_custom_object_status(
                        "dispatch.dev",
                        "v1alpha1",
                        FLOOR_NAMESPACE,
                        "dispatchjobs",
                        name,
                        {"status": {"observedNote": f"floor write, {parallel} at a time"}},
                        _content_type="application/merge-patch+json",
                    )

            t0 = time.monotonic()
            await asyncio.gather(*(one(n) for n in names))
            out[f"{parallel}_at_a_time_s"] = round(time.monotonic() - t0, 2)
            out[f"{parallel}_at_a_time_load"] = load()
        mass = self.result.get("mass_preemption", {})
        if mass:
            best = min(out["1_at_a_time_s"], out["8_at_a_time_s"])
            tail = (mass.get("server_clock") or mass)["last_failure_to_all_released_s"]
            out["ratio_mass_preemption_tail_to_floor"] = round(tail / best, 2)
            out["ratio_mass_preemption_total_to_floor"] = round(
                mass["hogs_start_to_all_released_s"] / best, 2
            )
        self.result["floor"] = out
        self.say(f"floor: {out}")

    async def recovery_floor(
        self, custom: CustomObjectsApi, samples: int
    ) -> Callable[[int], Awaitable[float]]:
        """The reaction's floor, measured beside it (one chain after each reaction sample, so under
        the same load): a recovery's four writes one after another by this process, in a namespace
        no operator watches (a status write the size of a real record, the create of a held
        PyTorchJob copied from one the operator made, the status again, the release's JSON patch).
        Applies ``samples`` DispatchJobs there; returns ``chain(i)`` -> its milliseconds."""
        api = cast(Any, custom)
        template = (
            await api.list_namespaced_custom_object(KUBEFLOW, "v1", NAMESPACE, "pytorchjobs", limit=1)
        )["items"][0]
        record = (
            await api.list_namespaced_custom_object(
                "dispatch.dev", "v1alpha1", NAMESPACE, "dispatchjobs", limit=1
            )
        )["items"][0]["status"]
        await self.apply([dispatchjob(f"reaction-floor-{i:05d}", FLOOR_NAMESPACE, 1) for i in range(samples)])
        meta = {k: template["metadata"][k] for k in ("labels", "annotations") if k in template["metadata"]}
        spec = {**template["spec"], "runPolicy": {**template["spec"].get("runPolicy", {}), "suspend": True}}
        release = [{"op": "replace", "path": "/spec/runPolicy/suspend", "value": False}]
        group, version = "dispatch.dev", "v1alpha1"
        merge = "application/merge-patch+json"

        async def chain(i: int) -> float:
            name = f"reaction-floor-{i:05d}"
            held = {
                **template,
                "metadata": {**meta, "name": name, "namespace": FLOOR_NAMESPACE},
                "spec": spec,
            }
            held.pop("status", None)
            t0 = time.monotonic()
            await api.patch_namespaced_custom_object_status(
                group, version, FLOOR_NAMESPACE, "dispatchjobs", name, {"status": record}, _content_type=merge
            )
            await api.create_namespaced_custom_object(KUBEFLOW, "v1", FLOOR_NAMESPACE, "pytorchjobs", held)
            await api.patch_namespaced_custom_object_status(
                group, version, FLOOR_NAMESPACE, "dispatchjobs", name, {"status": record}, _content_type=merge
            )
            await api.patch_namespaced_custom_object(
                KUBEFLOW,
                "v1",
                FLOOR_NAMESPACE,
                "pytorchjobs",
                name,
                release,
                _content_type="application/json-patch+json",
            )
            took = (time.monotonic() - t0) * 1000
            await api.delete_namespaced_custom_object(KUBEFLOW, "v1", FLOOR_NAMESPACE, "pytorchjobs", name)
            return took

        return chain

    async def records(self, custom: CustomObjectsApi) -> None:
        """Every preempted submission recorded with cause ``preempted``."""
        listed = await custom.list_namespaced_custom_object(
            "dispatch.dev", "v1alpha1", NAMESPACE, "dispatchjobs"
        )
        by_name = {o["metadata"]["name"]: o for o in listed["items"]}
        wrong: list[dict[str, Any]] = []
        others = Counter[str]()
        checked = 0
        for ptj in self.world.failed:
            job = self.world.ptj_job.get(ptj, "")
            n = int(ptj.rpartition("-")[2])
            subs = ((by_name.get(job) or {}).get("status") or {}).get("submissions") or []
            sub = next((s for s in subs if s.get("n") == n), None)
            kind = ((sub or {}).get("cause") or {}).get("kind")
            if ptj not in self.world.preempted:  # disrupted otherwise (a taint manager's eviction)
                others[str(kind)] += 1
                continue
            checked += 1
            if kind != "preempted":
                wrong.append({"job": job, "submission": n, "cause": kind})
        self.result["monitor"] = {
            "pytorchjob_events_checked": self.world.events,
            "two_released_violations": len(self.world.violations),
            "violations_first": self.world.violations[:5],
            "preempted_submissions_checked": checked,
            "recorded_with_another_cause": len(wrong),
            "wrong_first": wrong[:10],
            "other_disruptions_by_recorded_cause": dict(others),
        }
        self.say(f"monitor: {self.result['monitor']}")

    async def run(self) -> None:
        cfg = Configuration()
        await kconfig.load_kube_config(config_file=str(self.lab.kubeconfig), client_configuration=cfg)
        cfg.connection_pool_maxsize = 32
        w = self.world
        async with ApiClient(configuration=cfg) as api:
            custom, core, batch = CustomObjectsApi(api), CoreV1Api(api), BatchV1Api(api)
            self.custom = custom
            ptjs = functools.partial(
                custom.list_namespaced_custom_object, "kubeflow.org", "v1", NAMESPACE, "pytorchjobs"
            )
            djs = functools.partial(
                custom.list_namespaced_custom_object, "dispatch.dev", "v1alpha1", NAMESPACE, "dispatchjobs"
            )
            watches = [
                asyncio.create_task(follow(ptjs, w.pytorchjob, w.pytorchjob_deleted)),
                asyncio.create_task(
                    follow(functools.partial(core.list_namespaced_pod, NAMESPACE), w.pod, w.pod_deleted)
                ),
                asyncio.create_task(follow(djs, w.dispatchjob)),
                asyncio.create_task(
                    follow(functools.partial(core.list_namespaced_pod, PEER_NAMESPACE), w.peer_pod)
                ),
            ]
            del batch
            try:
                if not self.args.no_peer:
                    await self.peer(core)  # first: its pods are gone before the operator's run
                await (self.preloaded(api) if self.args.preload else self.creation())
                if self.args.settled:
                    await self.settled_population(api)
                await self.steady()
                if self.args.settle_load is not None:
                    await self.settle(self.args.settle_load)
                await self.restart()
                for i, tree in enumerate(self.args.restart_trees or (), start=1):
                    # The same cluster restarted by another tree (before/after on the same objects).
                    assert self.operator is not None
                    self.operator.tree = tree
                    await self.restart(f"restart_{i}")
                if self.args.hold is not None:
                    await self.hold(self.args.hold, len(self.args.restart_trees or ()) + 1)
                if self.args.scale_only:
                    return
                await self.reaction()
                if not self.args.no_mass:
                    await self.mass(core)
                await self.records(custom)
                await self.floor(custom)
                if "peer" in self.result and "mass_preemption" in self.result:
                    mp, peer = self.result["mass_preemption"], self.result["peer"]
                    mine, theirs = (
                        mp["failure_to_released_ms"]["median"],
                        peer["failure_to_replacement_ms"]["median"],
                    )
                    self.result["ratio_to_peer"] = {
                        "total": round(
                            mp["hogs_start_to_all_released_s"] / peer["hogs_start_to_all_replaced_s"], 2
                        ),
                        # by the bench's watches, which may hear of a failure after its recovery:
                        # no ratio of a negative span (the server clock's below is the one to read)
                        "per_job_median": round(mine / theirs, 2) if mine > 0 and theirs > 0 else None,
                    }
                    mp_clock, peer_clock = mp.get("server_clock") or {}, peer.get("server_clock") or {}
                    if mp_clock.get("last_failure_to_all_released_s") and peer_clock.get(
                        "last_failure_to_all_replaced_s"
                    ):
                        # the same spans on the API server's clock for both: the watches lag in a
                        # burst (the bench's own by seconds, so that per job they can go negative)
                        self.result["ratio_to_peer"]["tail_server_clock"] = round(
                            mp_clock["last_failure_to_all_released_s"]
                            / peer_clock["last_failure_to_all_replaced_s"],
                            2,
                        )
                        self.result["ratio_to_peer"]["per_job_median_server_clock"] = round(
                            mp_clock["failure_to_released_ms"]["median"]
                            / peer_clock["failure_to_replacement_ms_paired_in_order"]["median"],
                            2,
                        )
            finally:
                for t in watches:
                    t.cancel()
                for t in watches:
                    with contextlib.suppress(asyncio.CancelledError):
                        await t

    def close(self) -> None:
        if self.operator is not None:
            self.operator.stop()
        self.lab.stop()


def _interrupted(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # SIGTERM too: the lab and the operator are stopped on the way out


def parser() -> argparse.ArgumentParser:
    """The bench's options (other benchmarks on this harness take its defaults from here)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=1000, help="DispatchJobs running at once")
    parser.add_argument("--preempt", type=int, default=1000, help="jobs preempted at once (and peer Jobs)")
    parser.add_argument(
        "--samples", type=int, default=30, help="preemptions one at a time (reaction latency)"
    )
    parser.add_argument("--slots", type=int, default=200, help="pods of 1 cpu per kwok node (it is full)")
    parser.add_argument("--budget", type=int, default=5, help="each job's preempted -> resubmit budget")
    parser.add_argument("--operator-tree", help="run the operator from this source tree (default: this one)")
    parser.add_argument("--no-events", action="store_true", help="run the operator without Kubernetes Events")
    parser.add_argument("--no-peer", action="store_true", help="skip the batch/v1 Job peer")
    parser.add_argument("--no-mass", action="store_true", help="skip the mass preemption")
    parser.add_argument(
        "--watch-probe",
        action="store_true",
        help="in the mass preemption, time kubectl's pod watch against the audit log (the API server's lag)",
    )
    parser.add_argument(
        "--backlog",
        action="store_true",
        help="apply every DispatchJob with the operator stopped, then start it (creation at its own pace)",
    )
    parser.add_argument(
        "--preload",
        action="store_true",
        help="create the first --slots jobs, then copy the first one's objects for every other job"
        " through the API (as kubectl, the operator and the training operator write them), the"
        " operator stopped: the restart at 10,000 without the creation's hours, on a quiet cluster",
    )
    parser.add_argument("--preload-parallel", type=int, default=16, help="--preload: jobs copied at once")
    parser.add_argument(
        "--settled",
        type=int,
        default=0,
        help="also this many DispatchJobs that ran and settled (written through the API with the"
        " operator stopped, their status as the operator writes it), as a cluster keeps them",
    )
    parser.add_argument(
        "--restart-trees",
        nargs="*",
        metavar="DIR",
        help="after the restart, restart the operator again from each of these source trees in turn"
        " (restart_1, restart_2, ...: before/after on the same cluster and objects)",
    )
    parser.add_argument(
        "--scale-only",
        action="store_true",
        help="stop after creation, steady state and restart (RSS and sync time at 5,000 or 10,000)",
    )
    parser.add_argument(
        "--operator-flags",
        default="",
        help="more flags for the operator, e.g. '--write-qps=50' (Kueue's write limit; the default, "
        "auto, sets none on the lab, whose API server has Priority and Fairness)",
    )
    parser.add_argument(
        "--training-operator-flags",
        default="--kube-api-qps=100 --kube-api-burst=200 --controller-threads=4",
        help="the training operator's client flags (its defaults 20/30, 1 thread: minutes per 1,000 jobs)",
    )
    parser.add_argument(
        "--kcm-flags",
        default="--kube-api-qps=50 --kube-api-burst=100",
        help="kube-controller-manager's client flags (the peer; default: Kueue's 50/100, which the "
        "operator's --write-qps auto sets where the API server has no Priority and Fairness)",
    )
    parser.add_argument(
        "--hold",
        type=Path,
        metavar="FILE",
        help="after the restarts, keep the lab and restart from each source tree added to FILE (a line"
        " each; a line 'end' goes on to the next phase; 'apiserver BINARY' replaces the lab's"
        " kube-apiserver by another build, same flags and etcd)",
    )
    parser.add_argument(
        "--settle-load",
        type=float,
        metavar="LOAD",
        help="before the restart and the timed phases, wait (at most 20 min) until the one-minute"
        " load is under LOAD: the lab settled after a preload",
    )
    parser.add_argument(
        "--apiserver-profile",
        type=Path,
        metavar="DIR",
        help="start the lab's kube-apiserver with profiling on and save its CPU profile over each"
        " restart in DIR (<restart>.pprof, and go tool pprof -top's text beside it)",
    )
    parser.add_argument(
        "--apiserver-profile-seconds",
        type=int,
        default=15,
        help="--apiserver-profile: seconds of each profile, from the operator's start",
    )
    parser.add_argument("--appliers", type=int, default=8, help="kubectl processes applying the DispatchJobs")
    parser.add_argument("--keep", action="store_true", help="leave the lab's directory (logs) in place")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    options = parser()
    args = options.parse_args(argv)
    args.restart_trees = [Path(t).resolve() for t in args.restart_trees or ()]
    if args.jobs % args.slots or min(args.preempt, args.jobs) % args.slots:
        options.error("--jobs and --preempt must be multiples of --slots (every node full)")
    return run(Bench(args))


def run(bench: Bench) -> int:
    """Set up, run every phase, stop the lab and report (a SIGTERM stops it on the way out too)."""
    signal.signal(signal.SIGTERM, _interrupted)
    try:
        bench.setup()
        asyncio.run(bench.run())
    finally:
        bench.close()
        bench.result["work_dir"] = str(bench.work)
        report(bench.result, bench.args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

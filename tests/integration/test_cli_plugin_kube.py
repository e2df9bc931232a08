"""The kubectl plugin, Events and metrics on the real control plane.

The seed's scenario runs with the real record store (the DispatchJob's status, compare-and-swap by
resourceVersion on the API server) under the core's Supervisor, with the memory adapter as the
scheduler so the test decides when the job is preempted. Then, through ``kubectl dispatch`` (the
console script found by kubectl on PATH): ``history`` shows the seed's transitions, ``get`` and
``describe`` summarise the job, ``watch`` followed it as it happened; the Events of each transition
are on the API server; the metrics endpoint reports one recovery caused by ``preempted``.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

import dispatch
from dispatch._controller.events import EventRecorder
from dispatch._controller.listeners import Fanout
from dispatch._controller.metrics import Metrics
from dispatch._controller.store import KubeRecordStore
from dispatch._dispatchjob import job_spec, new_record
from dispatch._kubeclient import new_client
from tests.support.builders import SEED_HISTORY
from tests.support.kube import KubeCluster
from tests.support.operator_probe import scrape

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "examples" / "seed-dispatchjob.yaml"
BIN = Path(sys.executable).parent
PLUGIN = BIN / "kubectl-dispatch"


def plugin_env(cluster: KubeCluster) -> dict[str, str]:
    return {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "KUBECONFIG": str(cluster.kubeconfig),
    }


def kubectl_dispatch(cluster: KubeCluster, *args: str) -> str:
    """``kubectl dispatch ARGS``: kubectl finds the plugin on PATH."""
    proc = subprocess.run(
        [cluster.kubectl_bin, "dispatch", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=plugin_env(cluster),
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


async def until(what: str, probe: Callable[[], Any]) -> Any:
    async with asyncio.timeout(60):
        while True:
            found = probe()
            if found:
                return found
            await asyncio.sleep(0.02)
    raise AssertionError(what)  # pragma: no cover


def running(memory: dispatch.MemoryBackend, submission: int) -> str | None:
    for o in memory.objects():
        if o.submission == submission and o.phase is dispatch.Phase.RUNNING:
            return o.id
    return None


async def test_seed_scenario_through_the_plugin_events_and_metrics(crds: KubeCluster, namespace: str) -> None:
    cluster = crds
    cluster.kubectl("apply", "-n", namespace, "-f", str(SEED))
    job = f"{namespace}/finetune"

    # `plan` needs no cluster and says what the operator will do.
    assert kubectl_dispatch(cluster, "plan", "-f", str(SEED)).splitlines() == [
        "rule 0 is enforced by the supervisor",
        "uncovered: [node-lost out-of-memory time-limit non-zero-exit launch-failed no-capacity requeued unknown]",  # noqa: E501
    ]

    api = await new_client(str(cluster.kubeconfig))
    store = KubeRecordStore(api, namespaces=[namespace])
    memory = dispatch.MemoryBackend(dispatch.Shape.SLURM, auto_run=True)
    metrics = Metrics()
    metrics.instrument(api)  # every request of this client is counted
    recorder = EventRecorder.for_client(api, instance="test-0")
    server = metrics.serve(0, "127.0.0.1")
    watcher = await asyncio.create_subprocess_exec(
        str(PLUGIN),
        "watch",
        "finetune",
        "-n",
        namespace,
        "--timeout",
        "120",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=plugin_env(cluster),
    )
    try:
        # The watch prints the job as it is now before anything happens, then every change.
        assert watcher.stdout is not None
        head = (await asyncio.wait_for(watcher.stdout.readline(), 60)).decode()
        assert f"{namespace}/finetune  state=-" in head, head
        body = await store.read(job)
        spec = job_spec(body)
        plan = dispatch.make_plan(job, spec, memory.capabilities, supervised=True)
        await store.create(new_record(body, spec, plan))
        supervisor = dispatch.Supervisor(
            metrics.observe_backend(memory), store, listener=Fanout([recorder, metrics]), poll_interval=0.5
        )
        done = asyncio.create_task(supervisor.run(job))
        first = await until("submission 1 running", lambda: running(memory, 1))
        memory.env.preempt(first)
        second = await until("submission 2 running", lambda: running(memory, 2))
        memory.env.complete(second)
        settled = await done
        await recorder.drain()
        assert settled.settled
        assert settled.state is dispatch.State.SUCCEEDED

        out, err = await asyncio.wait_for(watcher.communicate(), 120)
        assert watcher.returncode == 0, err.decode()
        samples = await asyncio.to_thread(scrape, f"http://127.0.0.1:{server.server_port}/metrics")
    finally:
        if watcher.returncode is None:
            watcher.kill()
            await watcher.wait()
        server.shutdown()
        server.server_close()
        await store.aclose()
        await api.close()

    # watch: one line per change, ending when the job settled.
    lines = [head, *out.decode().splitlines()]
    states = [re.search(r"state=(\S+)", line).group(1) for line in lines]  # type: ignore[union-attr]
    assert states[-1] == "succeeded"
    assert "settled" in lines[-1]
    assert states[0] == "-"
    assert "pending" in states
    assert "recovering" in states
    assert "last: pending -> recovering (submission 2, by supervisor:supervisor)" in out.decode()

    # history: the seed's transitions.
    rows = [
        re.split(r" {3,}", line)
        for line in kubectl_dispatch(cluster, "history", "finetune", "-n", namespace).splitlines()
    ]
    assert rows[0] == ["TIME", "FROM", "TO", "SUBMISSION", "CAUSE", "ACTOR", "COST"]
    # What the preemption cost, on the transition that recorded it; the success cost nothing.
    assert re.fullmatch(r"[0-9.]+ node-s, running again after [0-9.]+ s", rows[1][6]), rows[1]
    assert rows[2][6] == "-"
    assert [r[1:6] for r in rows[1:]] == [
        [
            "pending",
            "recovering",
            "2",
            "preempted by a higher-priority job",  # the cause's kind said once
            "supervisor:supervisor",
        ],
        ["recovering", "succeeded", "2", "none", "supervisor:supervisor"],
    ]
    data = json.loads(kubectl_dispatch(cluster, "history", "finetune", "-n", namespace, "-o", "json"))
    assert [(t["from"], t["to"], t["submission"], t["cause"]["kind"]) for t in data] == SEED_HISTORY

    # get and describe.
    table = kubectl_dispatch(cluster, "get", "-n", namespace).splitlines()
    assert table[1].split()[:7] == ["finetune", "slurm", "succeeded", "-", "2", "1", "True"]
    summary = yaml.safe_load(kubectl_dispatch(cluster, "get", "finetune", "-n", namespace, "-o", "yaml"))
    assert (summary["state"], summary["submission"], summary["recoveries"], summary["settled"]) == (
        "succeeded",
        2,
        1,
        True,
    )
    text = kubectl_dispatch(cluster, "describe", "finetune", "-n", namespace)
    assert "rule 0 (supervisor): resubmit on [preempted], budget 2, fired 1, 1 left" in text
    assert max(len(line) for line in text.splitlines()) <= 100, text
    # the timeline: each submission's start, end, what started it and how it ended
    assert re.search(r"^\s+1\s+\S+Z\s+\S+Z\s+start\s+preempted by a higher-priority job$", text, re.M), text
    assert re.search(r"^\s+2\s+\S+Z\s+\S+Z\s+rule 0\s+succeeded$", text, re.M), text
    assert re.search(r"Normal\s+Recovering\s+submission 1 ended with cause preempted", text), text

    # Events: one per transition, by dispatch's reporting controller.
    events = json.loads(
        cluster.kubectl(
            "get", "events", "-n", namespace, "--field-selector", "involvedObject.name=finetune", "-o", "json"
        )
    )["items"]
    ours = sorted(
        (e for e in events if e.get("reportingComponent") == "dispatch.dev/dispatch-operator"),
        key=lambda e: e["eventTime"],
    )
    assert [(e["type"], e["reason"]) for e in ours] == [("Normal", "Recovering"), ("Normal", "Succeeded")]
    assert "budget 1 of 2 left" in ours[0]["message"]
    assert {e["involvedObject"]["uid"] for e in ours} == {body["metadata"]["uid"]}

    # Metrics: one recovery, caused by preempted, enforced by the supervisor.
    recoveries = [line for line in samples.splitlines() if line.startswith("dispatch_recoveries_total{")]
    assert recoveries == ['dispatch_recoveries_total{cause="preempted",enforcer="supervisor"} 1.0']
    assert 'dispatch_api_requests_total{code="201",resource="events",verb="create"} 2.0' in samples
    assert "dispatch_reaction_seconds_count 1.0" in samples
    assert re.search(
        r'dispatch_api_requests_total\{code="200",resource="dispatchjobs/status",verb="update"\} [1-9]',
        samples,
    )
    assert "dispatch_api_errors_total{" not in samples


def test_plugin_errors(crds: KubeCluster, namespace: str) -> None:
    proc = subprocess.run(
        [str(PLUGIN), "history", "missing", "-n", namespace],
        capture_output=True,
        text=True,
        timeout=60,
        env=plugin_env(crds),
        check=False,
    )
    assert proc.returncode == 1
    assert f'dispatchjobs.dispatch.dev "missing" not found in namespace {namespace}' in proc.stderr
    empty = subprocess.run(
        [str(PLUGIN), "get", "-n", namespace],
        capture_output=True,
        text=True,
        timeout=60,
        env=plugin_env(crds),
        check=False,
    )
    assert (empty.returncode, empty.stdout.strip()) == (0, f"No dispatchjobs found in namespace {namespace}.")


async def test_cancel_through_the_plugin_keeps_the_record(crds: KubeCluster, namespace: str) -> None:
    """``kubectl dispatch cancel`` sets spec.cancel; the supervisor ends the job cancelled, record kept."""
    cluster = crds
    cluster.kubectl("apply", "-n", namespace, "-f", str(SEED))
    job = f"{namespace}/finetune"
    api = await new_client(str(cluster.kubeconfig))
    store = KubeRecordStore(api, namespaces=[namespace])
    memory = dispatch.MemoryBackend(dispatch.Shape.SLURM, auto_run=True)
    try:
        body = await store.read(job)
        spec = job_spec(body)
        plan = dispatch.make_plan(job, spec, memory.capabilities, supervised=True)
        await store.create(new_record(body, spec, plan))
        done = asyncio.create_task(dispatch.Supervisor(memory, store, poll_interval=0.5).run(job))
        first = await until("submission 1 running", lambda: running(memory, 1))

        assert "cancel requested" in kubectl_dispatch(cluster, "cancel", "finetune", "-n", namespace)
        settled = await asyncio.wait_for(done, 60)
        assert settled.state is dispatch.State.CANCELLED
        assert [s.canonical for s in settled.submissions] == [first]
        assert [o.phase for o in memory.objects()] == [dispatch.Phase.ENDED]
        assert settled.history[-1].to is dispatch.State.CANCELLED
        assert settled.plan == plan
    finally:
        await store.aclose()
        await api.close()

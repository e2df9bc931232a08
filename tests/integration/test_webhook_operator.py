"""End to end with the real operator process (``python -m dispatch._controller --webhook-port ...
--metrics-port ...``) and the real Kubeflow training operator on the lab: a user applies the seed's
job, it is preempted and recovered; the actor recorded is the user who applied it; ``kubectl
dispatch history`` shows the seed's transitions; the operator posted an Event per transition; its
metrics endpoint reports one recovery caused by ``preempted``; the webhook it serves refuses an
unenforceable job."""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import (
    USERS_GROUP,
    OperatorProcess,
    apply_claiming,
    await_for,
    free_port,
    get_job,
    history,
    pytorchjobs,
    released_pj,
    users_may_submit,
)
from tests.support.builders import SEED_HISTORY, seed_job
from tests.support.kube import KubeCluster, KubectlError
from tests.support.lab import Kubeflow
from tests.support.operator_probe import scrape

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent


async def test_operator_with_webhook_events_and_metrics(
    crds: KubeCluster, namespace: str, operator: Callable[..., OperatorProcess], kubeflow: Kubeflow
) -> None:
    cluster = crds
    users_may_submit(cluster)
    managed = f"e{secrets.token_hex(3)}.dispatch.dev"
    metrics_port = free_port()
    op = operator(
        f"--webhook-port={free_port()}",
        f"--metrics-port={metrics_port}",
        "--log-format=json",
        env={"DISPATCH_WEBHOOK_HOST": "127.0.0.1", "DISPATCH_WEBHOOK_MANAGED": managed},
    )
    alice = cluster.mint_user("alice", [USERS_GROUP])
    try:
        # The webhook the operator serves refuses an unenforceable job (also as a dry run).
        bad = seed_job(
            "restarts", recovery={"rules": [{"on": ["preempted"], "action": "restart", "budget": 2}]}
        )

        def refused() -> str | None:
            try:
                cluster.kubectl("apply", "-n", namespace, "--dry-run=server", "-f", "-", input=bad)
            except KubectlError as error:
                return error.stderr if "denied the request" in error.stderr else None
            return None

        message = await await_for("the webhook refusing", refused)
        assert "rule 0 cannot be enforced: only a scheduler can restart in place" in message
        assert op.running, op.log()

        # Alice applies the seed's job, claiming to be someone else.
        await apply_claiming(cluster, namespace, "finetune", alice)
        first = await released_pj(cluster, namespace, 1)
        await asyncio.wait_for(kubeflow.wait_pods(namespace, first["metadata"]["name"], 2), 60)
        await await_for(
            "running",
            lambda: any(
                c["type"] == "Running" and c["status"] == "True"
                for pj in pytorchjobs(cluster, namespace)
                if pj["metadata"]["name"] == first["metadata"]["name"]
                for c in (pj.get("status") or {}).get("conditions") or ()
            ),
        )
        await kubeflow.preempt(namespace, first["metadata"]["name"])
        second = await released_pj(cluster, namespace, 2)
        await asyncio.wait_for(kubeflow.wait_pods(namespace, second["metadata"]["name"], 2), 60)
        await kubeflow.succeed(namespace, second["metadata"]["name"])
        await await_for(
            "settled", lambda: (get_job(cluster, namespace, "finetune").get("status") or {}).get("settled")
        )

        body = get_job(cluster, namespace, "finetune")
        assert history(body) == SEED_HISTORY
        assert body["status"]["submittedBy"] == {"kind": "human", "id": "alice"}
        assert body["metadata"]["annotations"]["dispatch.dev/submitted-by"] == "human:alice"

        # kubectl dispatch history (kubectl finds the plugin on PATH).
        env = {
            **os.environ,
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "KUBECONFIG": str(cluster.kubeconfig),
        }
        out = await asyncio.to_thread(plugin, cluster, env, "history", "finetune", "-n", namespace)
        rows = [re.split(r" {3,}", line) for line in out.splitlines()]
        assert [(r[1], r[2], r[3], r[4].split(":")[0]) for r in rows[1:]] == [
            ("pending", "recovering", "2", "preempted"),
            ("recovering", "succeeded", "2", "none"),
        ]
        summary = json.loads(
            await asyncio.to_thread(plugin, cluster, env, "get", "finetune", "-n", namespace, "-o", "json")
        )
        assert summary["submittedBy"] == "human:alice"

        # An Event per transition, from the operator.
        def ours() -> list[dict[str, Any]]:
            events = json.loads(
                cluster.kubectl(
                    "get",
                    "events",
                    "-n",
                    namespace,
                    "--field-selector",
                    "involvedObject.name=finetune",
                    "-o",
                    "json",
                )
            )["items"]
            mine = [e for e in events if e.get("reportingComponent") == "dispatch.dev/dispatch-operator"]
            reasons = {e["reason"] for e in mine}
            return mine if {"Recovering", "Succeeded"} <= reasons else []

        events = await await_for("the operator's events", ours)
        assert all(e["type"] in ("Normal", "Warning") for e in events)
        recovering = next(e for e in events if e["reason"] == "Recovering")
        assert "rule 0 (resubmit on [preempted]) fired" in recovering["message"]
        assert "budget 1 of 2 left" in recovering["message"]

        # Metrics: one recovery caused by preempted.
        samples = await asyncio.to_thread(scrape, f"http://127.0.0.1:{metrics_port}/metrics")
        recoveries = [line for line in samples.splitlines() if line.startswith("dispatch_recoveries_total{")]
        assert recoveries == ['dispatch_recoveries_total{cause="preempted",enforcer="supervisor"} 1.0']

        # JSON logs: one line per decision, with the job, the submission, the step and the cause.
        decisions = [
            json.loads(line) for line in op.log().splitlines() if line.startswith("{") and '"step"' in line
        ]
        assert any(
            d.get("job") == f"{namespace}/finetune"
            and str(d.get("step")).endswith("authorizing submission 2")
            and d.get("cause") == "preempted"
            for d in decisions
        ), op.log()[-3000:]
    finally:
        op.stop()
        for kind in ("validatingwebhookconfiguration", "mutatingwebhookconfiguration"):
            cluster.kubectl("delete", kind, managed, "--ignore-not-found", check=False)


def plugin(cluster: KubeCluster, env: dict[str, str], *args: str) -> str:
    """``kubectl dispatch ARGS`` (kubectl finds the plugin on PATH); its output."""
    return subprocess.run(
        [cluster.kubectl_bin, "dispatch", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=True,
    ).stdout

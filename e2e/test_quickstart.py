"""docs/quickstart.md, run as written on the lab: every ``sh`` block, in order, as one bash script.

Unchanged but for what differs here: the lab is the test tier's (``make lab-up`` and ``make
lab-down`` are left out, the kubeconfig is that lab's), the namespace is the test's, the operator's
ports are free ones and its log goes to the test's directory. Everything else, the preemption by
kube-scheduler and the recovery included, is the page's own commands.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from e2e.support import short_name
from tests.integration.conftest import free_port
from tests.support.kube import KubeCluster, let_go

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "quickstart.md"
LAB_LINES = ("make lab-up", "make lab-down")


def blocks() -> list[str]:
    return re.findall(r"^```sh\n(.*?)^```", PAGE.read_text(), re.S | re.M)


def script(kubeconfig: Path, namespace: str, log: Path) -> str:
    lines = []
    for block in blocks():
        for line in block.splitlines():
            if line.strip().startswith(LAB_LINES):
                continue
            lines.append(line)
    text = "\n".join(lines)
    health, metrics = str(free_port()), str(free_port())
    text = (
        text.replace("~/.cache/dispatch/lab/kubeconfig", str(kubeconfig))
        .replace("namespace quickstart", f"namespace {namespace}")
        .replace("-n quickstart", f"-n {namespace}")
        .replace("--namespace=quickstart", f"--namespace={namespace}")
        .replace("8081", health)
        .replace("8080", metrics)
    )
    assert "quickstart" not in text, text
    return text.replace("> operator.log", f"> {log}")


def test_the_page_runs_every_block() -> None:
    text = PAGE.read_text()
    fenced = re.findall(r"^```(\w*)$", text, re.M)
    assert blocks(), "docs/quickstart.md has no sh block"
    # An opening fence names its language; a block in any other is not run, so the page has none.
    assert {lang for lang in fenced[::2]} == {"sh"}, fenced
    assert any(line.startswith(LAB_LINES) for b in blocks() for line in b.splitlines())


def test_the_quickstart_recovers_a_preempted_job(kube_cluster: KubeCluster, tmp_path: Path) -> None:
    namespace = short_name("quick")  # the page creates its namespace itself
    log = tmp_path / "operator.log"
    env = {
        **os.environ,
        "PATH": f"{Path(kube_cluster.kubectl_bin).parent}{os.pathsep}{os.environ['PATH']}",
    }
    # Its own session, so that whatever the script leaves running (the operator, when a step
    # fails) is stopped with it.
    proc = subprocess.Popen(
        ["bash", "-euo", "pipefail", "-c", script(kube_cluster.kubeconfig, namespace, log)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=600)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        let_go(kube_cluster, namespace)
        kube_cluster.kubectl(
            "delete", "namespace", namespace, "--wait=false", "--ignore-not-found", check=False
        )
    operator = log.read_text()[-4000:] if log.exists() else "(no log)"
    assert proc.returncode == 0, f"docs/quickstart.md failed:\n{stdout}\n{stderr}\noperator log:\n{operator}"
    print(f"\n{stdout}")
    assert "rule 0 is enforced by the supervisor" in stdout
    assert 'dispatch_recoveries_total{cause="preempted",enforcer="supervisor"} 1.0' in stdout
    assert re.search(r"pending\s+recovering\s+2\s+preempted", stdout), stdout

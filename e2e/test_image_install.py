"""docs/install.md's walkthrough ("Trying the image against a cluster"), run as written on the lab.

The commands of the block after ``<!-- install-walkthrough -->`` run in bash, unchanged but for
what differs here: the kubeconfig is the lab's, the namespace the test's, the health port a free
one and the container's name unique; podman gets this machine's flags (runc, cgroupfs, explicit
ulimits) from a ``CONTAINERS_CONF`` file rather than from the command line, so the command line
stays the one the docs show.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
from pathlib import Path

import pytest

from e2e.podman import image_ref, podman, require_image
from tests.integration.conftest import free_port, pytorchjobs
from tests.support.kube import KubeCluster

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
MARKER = "<!-- install-walkthrough -->"
CONTAINERS_CONF = """\
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
"""


def walkthrough() -> str:
    text = (REPO / "docs" / "install.md").read_text()
    after = text[text.index(MARKER) + len(MARKER) :]
    match = re.match(r"\s*```sh\n(.*?)\n```", after, re.S)
    assert match, f"no ```sh block right after {MARKER} in docs/install.md"
    return match.group(1)


def test_the_install_walkthrough_runs_as_written(
    kube_cluster: KubeCluster, namespace: str, tmp_path: Path
) -> None:
    script = walkthrough()
    image = image_ref()
    require_image(image)
    assert image in script, f"docs/install.md runs {image!r}? it shows:\n{script}"
    kubeconfig = tmp_path / "kubeconfig"
    name = f"dispatch-operator-{secrets.token_hex(3)}"
    port = str(free_port())
    script = (
        script.replace("~/.kube/config", str(kube_cluster.kubeconfig))
        .replace("/tmp/dispatch-kubeconfig", str(kubeconfig))
        .replace("-n team-a", f"-n {namespace}")
        .replace("--namespace=team-a", f"--namespace={namespace}")
        .replace("8081", port)
        .replace("--name dispatch-operator", f"--name {name}")
    )
    script = re.sub(r"(podman stop [^\n]*) dispatch-operator$", rf"\1 {name}", script, flags=re.M)
    assert "team-a" not in script
    assert name in script.splitlines()[-1]
    conf = tmp_path / "containers.conf"
    conf.write_text(CONTAINERS_CONF)
    env = {
        **os.environ,
        "CONTAINERS_CONF": str(conf),
        "PATH": f"{Path(kube_cluster.kubectl_bin).parent}{os.pathsep}{os.environ['PATH']}",
        "KUBECONFIG": str(kube_cluster.kubeconfig),
    }
    try:
        proc = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
            cwd=REPO,
            check=False,
        )
        logs = podman("logs", name, check=False)
        assert proc.returncode == 0, (
            f"docs/install.md's walkthrough failed:\n{proc.stdout}\n{proc.stderr}\n"
            f"operator log:\n{(logs.stdout + logs.stderr)[-3000:]}"
        )
        print(f"\n{proc.stdout}")
        assert "finetune-llama-1" in proc.stdout, proc.stdout
        pjs = [p["metadata"]["name"] for p in pytorchjobs(kube_cluster, namespace)]
        assert pjs == ["finetune-llama-1"], pjs
        state = podman("inspect", "--format", "{{.State.ExitCode}} {{.State.Running}}", name).stdout.split()
        assert state == ["0", "false"], f"not a clean stop: {state}"
    finally:
        podman("rm", "--force", "--time=0", name, check=False)

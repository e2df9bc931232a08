"""The lab's real node (tests.support.node) with plain Pods, no dispatch: what a real kubelet,
containerd and runc report, where kwok's stages only write what they are told. A process's exit
code, the memory cgroup's OOM kill, SIGTERM before SIGKILL when a pod is deleted, and pod DNS
through CoreDNS are each observed on a real process.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.integration.conftest import wait_for
from tests.support.lab import Lab
from tests.support.node import NODE_IP, RealNode

pytestmark = [pytest.mark.integration, pytest.mark.node]

SLEEP = ["python3", "-c", "import time; time.sleep(3600)"]


def create(lab: Lab, manifest: dict[str, Any]) -> None:
    lab.kubectl("create", "-f", "-", input=json.dumps(manifest))


def terminated(lab: Lab, namespace: str, name: str) -> dict[str, Any]:
    """The container's terminated state, once the kubelet has reported it."""

    def state() -> dict[str, Any] | None:
        pod = lab.pod(namespace, name) or {}
        for status in (pod.get("status") or {}).get("containerStatuses") or ():
            done = (status.get("state") or {}).get("terminated")
            if done:
                return dict(done)
        return None

    found: dict[str, Any] = wait_for(f"{namespace}/{name} terminated", state)
    return found


def on_real_node(lab: Lab, node: RealNode, namespace: str, name: str) -> dict[str, Any]:
    pod = lab.pod(namespace, name)
    assert pod is not None
    assert pod["spec"]["nodeName"] == node.name, "the pod must run on the real node, not on kwok's"
    return pod


def running_ip(lab: Lab, namespace: str, name: str) -> str:
    def ip() -> str:
        pod = lab.pod(namespace, name) or {}
        status = pod.get("status") or {}
        return str(status.get("podIP") or "") if status.get("phase") == "Running" else ""

    return str(wait_for(f"{namespace}/{name} running", ip))


def test_a_container_exit_code_is_the_process_exit_code(
    lab: Lab, real_node: RealNode, namespace: str
) -> None:
    code = "import sys; print('failing with 3', flush=True); sys.exit(3)"
    create(lab, real_node.pod("exit3", ["python3", "-c", code], namespace=namespace))

    state = terminated(lab, namespace, "exit3")

    pod = on_real_node(lab, real_node, namespace, "exit3")
    assert (state["exitCode"], state["reason"]) == (3, "Error")
    assert wait_for(
        "phase Failed", lambda: (lab.pod(namespace, "exit3") or {})["status"]["phase"] == "Failed"
    )
    assert "failing with 3" in real_node.container_log(namespace, "exit3"), pod["status"]


def test_a_memory_limit_exceeded_is_oomkilled_by_the_cgroup(
    lab: Lab, real_node: RealNode, namespace: str
) -> None:
    # Pages written, not only reserved: each chunk counts against the cgroup at once.
    code = (
        "import time\n"
        "chunks = []\n"
        "for i in range(1, 65):\n"
        "    chunks.append(b'x' * (8 << 20))\n"
        "    print('allocated', 8 * i, 'MiB', flush=True)\n"
        "    time.sleep(0.02)\n"
        "print('survived 512 MiB', flush=True)\n"
    )
    limits = {"limits": {"memory": "64Mi"}}
    create(
        lab,
        real_node.pod("oom", ["python3", "-c", code], namespace=namespace, container={"resources": limits}),
    )

    state = terminated(lab, namespace, "oom")

    on_real_node(lab, real_node, namespace, "oom")
    log = real_node.container_log(namespace, "oom")
    assert (state["exitCode"], state["reason"]) == (137, "OOMKilled"), log
    assert "allocated 8 MiB" in log
    assert "survived" not in log


def test_a_deleted_pod_gets_sigterm_before_sigkill(lab: Lab, real_node: RealNode, namespace: str) -> None:
    # The handler writes through a hostPath volume, which this test reads on the host: the file can
    # only exist if SIGTERM came (SIGKILL cannot be handled), and its second line only if the
    # process still ran a second later (no SIGKILL right behind the SIGTERM).
    code = (
        "import signal, sys, time\n"
        "out = sys.argv[1]\n"
        "def on_term(signum, frame):\n"
        "    with open(out + '/sigterm', 'w') as f:\n"
        "        f.write(f'signal={signum}\\n')\n"
        "        f.flush()\n"
        "        time.sleep(1)\n"
        "        f.write('cleaned up\\n')\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, on_term)\n"
        "open(out + '/ready', 'w').close()\n"
        "while True:\n"
        "    time.sleep(0.2)\n"
    )
    out = real_node.host_dir / namespace
    manifest = real_node.pod(
        "graceful",
        ["python3", "-c", code, "/out"],
        namespace=namespace,
        terminationGracePeriodSeconds=30,
        volumes=[{"name": "out", "hostPath": {"path": str(out), "type": "DirectoryOrCreate"}}],
        container={"volumeMounts": [{"name": "out", "mountPath": "/out"}]},
    )
    create(lab, manifest)
    wait_for("the handler installed", (out / "ready").exists)
    on_real_node(lab, real_node, namespace, "graceful")

    lab.kubectl("delete", "pod", "graceful", "-n", namespace, "--grace-period=30", "--wait=false")
    wait_for("the pod gone", lambda: lab.pod(namespace, "graceful") is None)

    assert (out / "sigterm").read_text().splitlines() == ["signal=15", "cleaned up"]


def test_pod_dns_resolves_a_headless_service_through_coredns(
    lab: Lab, real_node: RealNode, namespace: str
) -> None:
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "rdzv", "namespace": namespace},
        "spec": {
            "clusterIP": "None",
            "selector": {"app": "rdzv"},
            "ports": [{"name": "rdzv", "port": 29500}],
        },
    }
    create(lab, service)
    create(
        lab,
        real_node.pod(
            "server", SLEEP, namespace=namespace, labels={"app": "rdzv"}, hostname="server", subdomain="rdzv"
        ),
    )
    server_ip = running_ip(lab, namespace, "server")
    # Resolves until every name answers (the Service's endpoints appear a moment after the server
    # is Ready), then reports through the termination message, which the kubelet reads on exit.
    code = (
        "import json, socket, sys, time\n"
        "names = ['rdzv', 'server.rdzv', 'no-such-service']\n"
        "deadline = time.time() + 60\n"
        "while True:\n"
        "    found = {}\n"
        "    for n in names:\n"
        "        try:\n"
        "            found[n] = sorted(socket.gethostbyname_ex(n)[2])\n"
        "        except OSError as e:\n"
        "            found[n] = str(e)\n"
        "    if all(isinstance(found[n], list) for n in names[:2]) or time.time() > deadline:\n"
        "        break\n"
        "    time.sleep(0.5)\n"
        "found['resolv.conf'] = open('/etc/resolv.conf').read()\n"
        "open('/dev/termination-log', 'w').write(json.dumps(found))\n"
    )
    create(lab, real_node.pod("client", ["python3", "-c", code], namespace=namespace))

    state = terminated(lab, namespace, "client")

    on_real_node(lab, real_node, namespace, "client")
    found = json.loads(state.get("message") or "{}")
    assert found.get("rdzv") == [server_ip], found
    assert found.get("server.rdzv") == [server_ip], found
    assert not isinstance(found.get("no-such-service"), list), found
    resolv = found["resolv.conf"].split()
    assert resolv[resolv.index("nameserver") + 1] == NODE_IP
    assert f"{namespace}.svc.cluster.local" in resolv

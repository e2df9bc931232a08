"""What every recorder of the real stack shares (hack/<backend>-record.py): kubectl, the watch
recorder and the waits. Nothing here is written into a recording by hand: it only drives kubectl."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.support, beside hack/
from tests.support.kube import release_finalizers

Body = dict[str, Any]


def kubectl_binary() -> str:
    found = shutil.which("kubectl")
    if found:
        return found
    cache = Path(os.environ.get("DISPATCH_CACHE", Path.home() / ".cache" / "dispatch")) / "bin"
    for candidate in sorted(cache.glob("kubectl-*/kubectl"), reverse=True):
        return str(candidate)
    raise SystemExit("kubectl not found (PATH or ~/.cache/dispatch/bin/kubectl-*)")


KUBECTL = kubectl_binary()


def kubectl(*args: str, input: str | None = None, check: bool = True) -> str:
    done = subprocess.run(
        [KUBECTL, *args], input=input, capture_output=True, text=True, check=False, timeout=120
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout + (done.stderr if not check else "")


def get(kind: str, name: str = "", *, ns: str | None, selector: str = "") -> Body:
    args = ["get", kind, *([name] if name else []), "-o", "json"]
    if ns:
        args += ["-n", ns]
    if selector:
        args += ["-l", selector]
    return json.loads(kubectl(*args))  # type: ignore[no-any-return]


def trim(obj: Body) -> Body:
    obj.get("metadata", {}).pop("managedFields", None)
    return obj


def until(what: str, check: Callable[[], bool], seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (RuntimeError, ValueError, KeyError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"timed out waiting for {what}")


@dataclass
class Recording:
    """Every watch event of the resources watched, in arrival order, with its time."""

    name: str
    what: str
    namespace: str
    stream: list[Body] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    procs: list[subprocess.Popen[str]] = field(default_factory=list)
    extra_objects: list[Body] = field(default_factory=list)
    t0: float = field(default_factory=time.monotonic)

    def watch(self, resource: str, selector: str) -> None:
        proc = subprocess.Popen(
            [
                KUBECTL,
                "get",
                resource,
                "-n",
                self.namespace,
                "-l",
                selector,
                "-w",
                "--output-watch-events",
                "-o",
                "json",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.procs.append(proc)

        def pump() -> None:
            decoder = json.JSONDecoder()
            buf = ""
            assert proc.stdout is not None
            for line in proc.stdout:
                buf += line
                while buf.strip():
                    try:
                        event, end = decoder.raw_decode(buf.lstrip())
                    except ValueError:
                        break
                    buf = buf.lstrip()[end:]
                    with self.lock:
                        self.stream.append(
                            {
                                "at": round(time.monotonic() - self.t0, 3),
                                "resource": resource,
                                "type": event.get("type"),
                                "object": trim(event.get("object") or {}),
                            }
                        )

        threading.Thread(target=pump, daemon=True).start()

    def stop(self) -> None:
        time.sleep(1.0)  # let the last events arrive
        for proc in self.procs:
            proc.terminate()
            proc.wait(timeout=10)


def preempt(namespace: str, pod: str, image: str) -> None:
    """A real kube-scheduler preemption: a pod of a higher priority that needs the victim's whole node."""
    node = get("pod", pod, ns=namespace)["spec"]["nodeName"]
    cpu = get("node", node, ns=None)["status"]["allocatable"]["cpu"]
    priority = {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": "lab-high"},
        "value": 1000000,
    }
    kubectl("apply", "-f", "-", input=json.dumps(priority))
    preemptor = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"preemptor-{pod}",
            "namespace": namespace,
            "labels": {"lab.dispatch.io/preemptor": "true"},
        },
        "spec": {
            "priorityClassName": "lab-high",
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [{"name": "main", "image": image, "resources": {"requests": {"cpu": cpu}}}],
        },
    }
    kubectl("create", "-f", "-", input=json.dumps(preemptor))


def cleanup_preemptors(namespace: str) -> None:
    kubectl(
        "delete", "pods", "-n", namespace, "-l", "lab.dispatch.io/preemptor=true", "--wait=false", check=False
    )


def let_go(namespace: str, resource: str) -> None:
    """Remove dispatch's finalizer from every object of ``resource`` left in the namespace (no
    operator runs to do it), as the tests' namespace teardown does."""
    release_finalizers(kubectl, namespace, (resource,))


def write(out: Path, name: str, rec: Recording, extra: dict[str, Any]) -> None:
    """The recording, the namespace's events, the server's version: ``out/<name>.json``."""
    events = [trim(e) for e in get("events", ns=rec.namespace).get("items") or []]
    version = json.loads(kubectl("version", "-o", "json")).get("serverVersion", {}).get("gitVersion")
    data = {
        "scenario": name,
        "what": rec.what,
        "recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "kubernetes": version,
        **extra,
        "stream": rec.stream,
        "events": events,
    }
    if rec.extra_objects:
        data["objects"] = rec.extra_objects
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"{name}: {len(rec.stream)} watch events, {len(events)} events", flush=True)

#!/usr/bin/env python3
"""Benchmark: one namespace's recovery while another namespace floods the operator, before/after.

    .venv/bin/python bench/namespace_flood.py [--flood 2000] [--samples 3] [--before-ref main]
        [--json out.json]

The lab (tests/support/lab.py). For each operator tree, in the same run (``--before-ref`` as a
``git archive``, then this tree), in namespaces of its own so that the two operators never share a
job: ``--samples`` victims, each a Kubeflow DispatchJob in a namespace of its own on a kwok node of
its own, whose rule resubmits on ``preempted``. Each victim is preempted once with the operator
quiet (kube-scheduler's preemption, the lab's ``preempt_pod``), timed from the preemptor's creation
to the victim's next PyTorchJob released (polled every 50 ms). Then the operator is stopped,
``--flood`` DispatchJobs are created in one more namespace (their pods cannot be scheduled: a node
selector no node has), the operator is started again, and once it has created the flood's first
PyTorchJob every victim is preempted at once, timed the same way: each recovery competes with the
flood's backlog; with ``--running`` the flood is created while the operator runs instead (16
clients), and the victims are preempted as soon as its first PyTorchJob exists. Each tree has a lab
of its own, one after the other. Medians of both trees are printed side by side, with the load.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "operator"))

from bench.operator_bench import OPERATOR_USER, dispatchjob  # noqa: E402
from tests.support.controlplane import resolve_binaries  # noqa: E402
from tests.support.lab import Lab, node_manifest  # noqa: E402

VICTIM = "victim"


def load() -> float:
    return round(os.getloadavg()[0], 2)


def say(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} [load {load()}] {text}", file=sys.stderr, flush=True)


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.work = Path(tempfile.mkdtemp(prefix="dispatch-flood-"))
        self.lab = Lab(self.work / "lab", nodes=0, start_timeout=300)
        self.kubectl: list[str] = []
        self.identity = Path()

    def run_kubectl(self, *argv: str, stdin: str | None = None) -> str:
        out = subprocess.run(
            [*self.kubectl, *argv], input=stdin.encode() if stdin else None, check=True, capture_output=True
        )
        return out.stdout.decode()

    def setup(self) -> None:
        self.lab.start()
        self.kubectl = [resolve_binaries().kubectl, f"--kubeconfig={self.lab.kubeconfig}"]
        self.identity = self.lab.mint_user(OPERATOR_USER, ["system:masters"])

    def tree(self, ref: str) -> Path:
        if ref == "HEAD-worktree":
            return REPO
        out = self.work / f"tree-{ref}"
        out.mkdir()
        archive = subprocess.run(["git", "-C", str(REPO), "archive", ref], check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", str(out)], input=archive.stdout, check=True)
        return out

    def start_operator(self, tree: Path, namespaces: list[str], log: Path) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "dispatch._controller", f"--kubeconfig={self.identity}"]
        argv += [f"--namespace={n}" for n in namespaces]
        argv += [
            "--backend=kubeflow",
            "--no-events",
            "--log-level=WARNING",
            *shlex.split(self.args.operator_flags),
        ]
        env = {**os.environ, "PYTHONPATH": str(tree / "operator")}
        with log.open("wb") as out:
            return subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, cwd=tree, env=env, start_new_session=True
            )

    def released(self, namespace: str, submission: int) -> bool:
        items = (
            self.lab.request(
                "GET",
                f"/apis/kubeflow.org/v1/namespaces/{namespace}/pytorchjobs",
                query={"labelSelector": f"dispatch.dev/job={VICTIM},dispatch.dev/submission={submission}"},
            ).get("items")
            or []
        )
        return any(((i.get("spec") or {}).get("runPolicy") or {}).get("suspend") is False for i in items)

    def running_pod(self, namespace: str, submission: int) -> str | None:
        pods = self.lab.pods(namespace, f"dispatch.dev/job={VICTIM},dispatch.dev/submission={submission}")
        for pod in pods:
            if (pod.get("status") or {}).get("phase") == "Running" and not pod["metadata"].get(
                "deletionTimestamp"
            ):
                return str(pod["metadata"]["name"])
        return None

    def wait(self, what: str, probe: Any, within: float) -> Any:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            value = probe()
            if value:
                return value
            time.sleep(0.05)
        raise TimeoutError(what)

    def recovery(self, namespace: str, submission: int) -> float:
        """Preempt submission ``submission``'s pod; seconds from the preemptor's creation until
        submission + 1 is released (kube-scheduler's preemption included: the same in both trees)."""
        pod = self.wait("victim running", lambda: self.running_pod(namespace, submission), 300)
        t0 = time.monotonic()
        self.lab.preempt_pod(namespace, pod)
        self.wait("next released", lambda: self.released(namespace, submission + 1), 900)
        return time.monotonic() - t0

    def flood_docs(self, namespace: str) -> list[dict[str, Any]]:
        docs = []
        for i in range(self.args.flood):
            doc = dispatchjob(f"flood-{i:05d}", namespace, 3, nodeSelector={"lab.dispatch.io/none": "x"})
            doc["spec"]["kubeflow"]["resources"] = {"cpu": "1"}
            doc["spec"]["kubeflow"]["noCapacityAfterSeconds"] = 86400
            docs.append(doc)
        return docs

    def post_all(self, docs: list[dict[str, Any]], namespace: str) -> None:
        path = f"/apis/dispatch.dev/v1alpha1/namespaces/{namespace}/dispatchjobs"
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda doc: self.lab.request("POST", path, doc), docs))

    def one_tree(self, name: str, ref: str) -> dict[str, Any]:
        tree = self.tree(ref)
        victims = [f"victim-{name}-{i}" for i in range(self.args.samples)]
        flood_ns = f"flood-{name}"
        crd = str(tree / "crds/dispatch.dev_dispatchjobs.yaml")  # the operator's own (its defaults)
        self.run_kubectl("apply", "--server-side", "--force-conflicts", "-f", crd)
        self.run_kubectl("wait", "--for=condition=Established", "crd/dispatchjobs.dispatch.dev")
        nodes = [f"{ns}-node" for ns in victims]
        for ns, node in zip(victims, nodes, strict=True):
            self.run_kubectl("create", "namespace", ns)
            self.run_kubectl("create", "-f", "-", stdin=json.dumps(node_manifest(node, cpu="2", pods="20")))
        self.run_kubectl("create", "namespace", flood_ns)
        log = self.work / f"operator-{name}"
        op = self.start_operator(tree, [*victims, flood_ns], log.with_suffix(".1.log"))
        try:
            for ns, node in zip(victims, nodes, strict=True):
                victim = dispatchjob(VICTIM, ns, 100, nodeSelector={"kubernetes.io/hostname": node})
                victim["spec"]["kubeflow"]["resources"] = {"cpu": "1"}
                self.run_kubectl("apply", "--server-side", "-f", "-", stdin=json.dumps(victim))
            quiet = [self.recovery(ns, 1) for ns in victims]
            for ns in victims:
                self.wait("victim running again", lambda ns=ns: self.running_pod(ns, 2), 300)
            say(f"{name}: quiet recoveries {[round(q, 3) for q in quiet]}")
            if self.args.running:
                return self.flooded(ref, name, victims, flood_ns, quiet)
        finally:
            os.killpg(op.pid, signal.SIGTERM)
            op.wait(60)
        t0 = time.monotonic()
        self.post_all(self.flood_docs(flood_ns), flood_ns)
        created = time.monotonic() - t0
        say(f"{name}: {self.args.flood} DispatchJobs created in {created:.1f}s, the operator stopped")
        op = self.start_operator(tree, [*victims, flood_ns], log.with_suffix(".2.log"))
        try:
            return self.flooded(ref, name, victims, flood_ns, quiet, created)
        finally:
            os.killpg(op.pid, signal.SIGTERM)
            op.wait(60)

    def flooded(
        self, ref: str, name: str, victims: list[str], flood_ns: str, quiet: list[float], created: float = 0.0
    ) -> dict[str, Any]:
        """Every victim preempted at once once the operator works on the flood (with ``--running``,
        the flood is created meanwhile, by 16 clients)."""
        with ThreadPoolExecutor(1) as creator:
            t0 = time.monotonic()
            if self.args.running:
                posting = creator.submit(self.post_all, self.flood_docs(flood_ns), flood_ns)
            self.wait(
                "the operator working on the flood",
                lambda: self.lab.request(
                    "GET", f"/apis/kubeflow.org/v1/namespaces/{flood_ns}/pytorchjobs", query={"limit": "1"}
                ).get("items"),
                300,
            )
            with ThreadPoolExecutor(len(victims)) as pool:
                flooded = list(pool.map(lambda ns: self.recovery(ns, 2), victims))
            say(f"{name}: flooded recoveries {[round(f, 3) for f in flooded]}")
            if self.args.running:
                posting.result()
                created = time.monotonic() - t0
            return {
                "ref": ref,
                "quiet_s": quiet,
                "flooded_s": flooded,
                "quiet_median_s": statistics.median(quiet),
                "flooded_median_s": statistics.median(flooded),
                "flood_created_s": created,
                "load": load(),
            }

    def main(self) -> dict[str, Any]:
        out: dict[str, Any] = {"flood": self.args.flood, "samples": self.args.samples}
        for name, ref in (("before", self.args.before_ref), ("after", "HEAD-worktree")):
            # A lab each: a flood left behind keeps the training operator busy for minutes (it
            # takes PyTorchJobs in order, whatever their namespace), and the victims' pods with it.
            self.lab = Lab(self.work / f"lab-{name}", nodes=0, start_timeout=300)
            self.setup()
            try:
                out[name] = self.one_tree(name, ref)
            finally:
                self.lab.stop()
        return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--flood", type=int, default=2000)
    p.add_argument("--samples", type=int, default=3)
    p.add_argument("--before-ref", default="main", help="the git ref of the operator measured first")
    p.add_argument("--operator-flags", default="", help="extra flags of both operators")
    p.add_argument(
        "--running",
        action="store_true",
        help="create the flood while the operator runs, instead of while it is stopped",
    )
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the lab on the way out
    result = Run(args).main()
    text = json.dumps(result, indent=1)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")
    b, a = result["before"], result["after"]
    print(
        f"recovery median, quiet: before {b['quiet_median_s']:.3f}s, after {a['quiet_median_s']:.3f}s; "
        f"during a flood of {args.flood}: before {b['flooded_median_s']:.3f}s, "
        f"after {a['flooded_median_s']:.3f}s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

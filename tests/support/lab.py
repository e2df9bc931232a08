"""The test lab: a Kubernetes cluster made of the real parts, on loopback, without Docker or a kubelet.

etcd + kube-apiserver (:mod:`tests.support.controlplane`, with an audit log) + kube-scheduler +
kube-controller-manager (every default controller, each under its own ServiceAccount) + kwok
(the nodes and their kubelet, stages in ``tests/support/kwok.yaml``) + Kubeflow's training
operator v1.9.3 (its PyTorchJob controller and validating webhook, under its upstream RBAC, with
the project's own ``main``: ``hack/training-operator-lab/main.go``). Binaries come from
``make bins`` (``hack/build-bins.sh``). Every daemon listens on 127.0.0.1 on a free port, runs in
its own process group and is stopped by PID (see :class:`ControlPlane`).

The failure mechanisms are the real ones: preemption by kube-scheduler (a higher-priority pod and
a full node), NoExecute taint eviction and node-lifecycle (kube-controller-manager), pod GC after a
node is deleted, the Eviction API. Only what a kubelet itself reports is played by kwok: a
container's exit (code and reason), an image that cannot be pulled, a deadline kill, a container
waiting, and the termination of a deleted pod (see docs/testing.md).

Opt-in extras (``Lab(extras=("jobset", "trainer"))``, ``up --with jobset,trainer``, or
:meth:`Lab.start_extras` on a running lab): JobSet v0.11.1 with its JobSet mutating and
validating webhooks registered (its reconciler relies on the defaults the mutating one sets), and
Kubeflow Trainer v2.2.0 (``trainer`` implies ``jobset``) with its CRDs, its webhooks, namespace
``kubeflow-system`` and the ``torch-distributed`` ClusterTrainingRuntime. Both serve their
webhooks on 127.0.0.1 with a cert from the lab's CA. Trainer reads its serving cert from the
hard-coded ``/tmp/k8s-webhook-server/serving-certs``: one Trainer per machine, so the lab takes
that directory under a lock, waits while another live lab holds it, and removes it when it stops.
``kueue``: Kueue v0.17.0 (config ``config.kueue.x-k8s.io/v1beta2``, see :func:`kueue_config`) with
its CRDs, namespace ``kueue-system`` and its internal cert management; the frameworks it manages
follow what the lab runs (batch/job, plus PyTorchJob, JobSet and TrainJob when those run; it is
restarted when a later extra adds one). Its webhooks are not registered: their certificate names
``kueue-webhook-service.kueue-system.svc``, which nothing here resolves, so Kueue admits and evicts
through its reconcilers only (a queue-labelled object must be created suspended, as dispatch does).
Read its objects as ``kueue.x-k8s.io/v1beta2`` (the storage version): other versions go through
the CRD conversion webhook, which fails here for the same reason.

Python use::

    with Lab(tmp_dir) as lab:
        lab.kubeconfig
        lab.preempt_pod("ns", "train-1-master-0")

The lab is kept in three modules, each re-exported here: :mod:`tests.support.lab_setup` (its
constants, binaries and manifests), :mod:`tests.support.lab_cluster` (:class:`Lab`: its processes,
API access and failure mechanisms) and :mod:`tests.support.lab_facade` (:class:`Kubeflow`, the
async facade the tests call). This module adds :func:`lab` and the command line.

CLI use (the daemons keep running after the command returns)::

    python -m tests.support.lab up --dir DIR     # writes DIR/kubeconfig, DIR/state.json
    python -m tests.support.lab down --dir DIR   # stops them by PID
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tests.support.controlplane import detached_cli
from tests.support.lab_api import *  # noqa: F403

# Every public name of the lab's three modules is importable from here (their __all__).
from tests.support.lab_cluster import *  # noqa: F403
from tests.support.lab_cluster import Lab, release_trainer_cert_dir
from tests.support.lab_facade import *  # noqa: F403
from tests.support.lab_failures import *  # noqa: F403
from tests.support.lab_setup import *  # noqa: F403
from tests.support.lab_setup import EXTRAS

# ---- CLI --------------------------------------------------------------------------------


@contextlib.contextmanager
def lab(workdir: Path | str, **kwargs: Any) -> Iterator[Lab]:
    """``with lab(dir) as l: ...`` — starts and always stops."""
    running = Lab(workdir, **kwargs)
    try:
        running.start()
        yield running
    finally:
        running.stop()


def _cli(argv: Sequence[str] | None = None) -> int:
    def options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--nodes", type=int, default=3)
        parser.add_argument(
            "--with",
            dest="extras",
            default="",
            help=f"comma-separated opt-in extras: {','.join(EXTRAS)} (trainer implies jobset)",
        )

    def make(args: argparse.Namespace) -> Lab:
        extras = [e.strip() for e in args.extras.split(",") if e.strip()]
        return Lab(args.dir, nodes=args.nodes, start_timeout=args.timeout, extras=extras)

    argv = list(sys.argv[1:] if argv is None else argv)
    rc = detached_cli(
        argv, prog="python -m tests.support.lab", what="lab", timeout=120.0, make=make, add_arguments=options
    )
    if rc == 0 and argv[:1] == ["down"] and "--dir" in argv:
        release_trainer_cert_dir(argv[argv.index("--dir") + 1])
    return rc


if __name__ == "__main__":
    sys.exit(_cli())

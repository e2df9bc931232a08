"""What each real scheduler enforces by itself: the one source of every backend's capabilities.

The real adapters (``dispatch._kubeflow``, ``dispatch._slurm``), the memory adapter's shapes, the
kubectl plugin's ``plan`` and the operator's admission webhook all read these, so a plan made
without a cluster is the plan the operator makes. Pure data: importing it loads no client.
"""

from __future__ import annotations

from typing import Final

from ._model import Action, Capabilities, CauseKind, NativeRule

KUBEFLOW: Final = Capabilities(
    native=(
        NativeRule(
            causes=frozenset({CauseKind.NON_ZERO_EXIT, CauseKind.OUT_OF_MEMORY}),
            action=Action.RESTART,
            note=(
                "restartPolicy OnFailure restarts failed pods in place, up to backoffLimit; the training"
                " operator also recreates a preempted, evicted or node-lost pod uncounted, so dispatch"
                " stops the PyTorchJob on such a cause (while no dispatch operator runs, it cannot)"
            ),
        ),
    )
)
"""Kubeflow's restartPolicy OnFailure restarts failed pods in place, exactly [non-zero-exit
out-of-memory], up to ``backoffLimit`` (budget 0..100)."""

SLURM: Final = Capabilities()
"""Slurm enforces no recovery rule exactly: its MaxBatchRequeue limit is checked on launch-failure
and node-failure requeues but not on preemption requeues (PreemptMode=REQUEUE raises restart_cnt
unchecked), so a budget is not exact for preemption; and a job's requeue flag allows node-failure
requeues only together with preemption requeues, so [node-lost] alone is not exact either. Every
rule goes to the supervisor, and a restart rule is refused by the plan."""

BY_BACKEND: Final = {"kubeflow": KUBEFLOW, "slurm": SLURM}
"""By the name a DispatchJob's ``spec.backend`` uses."""

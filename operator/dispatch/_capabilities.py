"""What Kubeflow and Slurm enforce by themselves: the one source of those two backends' capabilities.

Their registry entries (``dispatch._backends.kubeflow``, ``.slurm``) declare these values, and the
real adapters and the memory adapter's shapes read them here, so the kubectl plugin's ``plan`` and
the operator's webhook (which read the registry) plan exactly as the adapters do. A newer backend
declares its capabilities in its registry entry only. Pure data: importing it loads no client.
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

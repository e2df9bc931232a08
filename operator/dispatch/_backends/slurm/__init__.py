"""The ``slurm`` backend's declaration: batch jobs on Slurm through slurmrestd."""

from __future__ import annotations

from typing import Final

from ..._model import Capabilities, SlurmOptions
from ..._registry import BackendInfo, Where

SLURM: Final = Capabilities()
"""Slurm enforces no recovery rule exactly: its MaxBatchRequeue limit is checked on launch-failure
and node-failure requeues but not on preemption requeues (PreemptMode=REQUEUE raises restart_cnt
unchecked), so a budget is not exact for preemption; and a job's requeue flag allows node-failure
requeues only together with preemption requeues, so [node-lost] alone is not exact either. Every
rule goes to the supervisor, and a restart rule is refused by the plan."""

BACKEND: Final = BackendInfo(
    name="slurm",
    summary="batch jobs on Slurm through slurmrestd, configured with --slurm-config",
    where=Where.EXTERNAL,
    capabilities=SLURM,
    open="dispatch._backends.slurm._adapter:open_adapter",
    options=SlurmOptions,
)

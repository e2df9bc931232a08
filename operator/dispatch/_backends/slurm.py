"""The ``slurm`` backend's declaration: batch jobs on Slurm through slurmrestd."""

from __future__ import annotations

from typing import Final

from .._capabilities import SLURM
from .._model import SlurmOptions
from .._registry import BackendInfo, Where

BACKEND: Final = BackendInfo(
    name="slurm",
    summary="batch jobs on Slurm through slurmrestd, configured with --slurm-config",
    where=Where.EXTERNAL,
    capabilities=SLURM,
    open="dispatch._slurm:open_adapter",
    options=SlurmOptions,
)

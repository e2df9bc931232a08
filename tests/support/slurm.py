"""pytest plugin: a session-scoped real Slurm lab (``slurm_lab``) and a per-test clean view of it (``slurm``).

Register with ``pytest_plugins = ["tests.support.slurm"]`` in the top-level conftest, or import the
fixtures into a test module. Missing Debian packages fail the run (CI installs them with
``make slurm-deps``) unless ``DISPATCH_ALLOW_SKIP=1``, which skips instead.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.support.slurmlab import SlurmLab, missing_prerequisites

LAB_MIN_JOB_AGE = 10
"""Seconds Slurm keeps a finished job: short, so that the 'Slurm forgot it' path is exercised."""


@pytest.fixture(scope="session")
def slurm_lab() -> Iterator[SlurmLab]:
    missing = missing_prerequisites()
    if missing:
        why = f"real Slurm lab unavailable, missing: {', '.join(missing)} (run `make slurm-deps` as root)"
        if os.environ.get("DISPATCH_ALLOW_SKIP") == "1":
            pytest.skip(why)
        pytest.fail(why + "; set DISPATCH_ALLOW_SKIP=1 to skip instead")
    with SlurmLab(min_job_age=LAB_MIN_JOB_AGE, slurmd_timeout=10, kill_wait=2) as lab:
        yield lab


@pytest.fixture
def slurm(slurm_lab: SlurmLab) -> Iterator[SlurmLab]:
    """The session's lab, with no job left and the node back up after the test."""
    yield slurm_lab
    slurm_lab.cancel_all_jobs(wait=15)
    state = slurm_lab.node_state()
    if any(word in state for word in ("down", "drain", "fail")):
        slurm_lab.set_node_state("resume")
        slurm_lab.wait_for(
            lambda: slurm_lab.node_state().rstrip("*") in ("idle", "mixed", "allocated"), 30, "node back up"
        )

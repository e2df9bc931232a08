"""pytest plugin: session-scoped real Slurm labs (``slurm_lab``) and a per-test clean view (``slurm``).

Both are parametrized over the three Slurms sites run (22.05 on the host, 24.11 and 26.05 from their
chroots), so every test that takes ``slurm`` runs once against each. pytest groups the tests by
lab, so at most one lab runs at a time. ``DISPATCH_SLURM=22.05,26.05`` narrows the set for a quick
local run. A missing prerequisite fails the run (``make integration`` installs and builds them)
unless ``DISPATCH_ALLOW_SKIP=1``, which skips instead.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.support.slurmlab import FLAVORS, SlurmLab, missing_prerequisites

LAB_MIN_JOB_AGE = 10
"""Seconds Slurm keeps a finished job: short, so that the 'Slurm forgot it' path is exercised."""


def slurm_versions() -> list[str]:
    wanted = os.environ.get("DISPATCH_SLURM")
    if not wanted:
        return list(FLAVORS)
    out = [v.strip() for v in wanted.split(",") if v.strip()]
    unknown = [v for v in out if v not in FLAVORS]
    if unknown:
        raise pytest.UsageError(
            f"DISPATCH_SLURM names unknown Slurm versions {unknown} (known: {list(FLAVORS)})"
        )
    return out


@pytest.fixture(scope="session", params=slurm_versions(), ids=lambda v: f"slurm-{v}")
def slurm_lab(request: pytest.FixtureRequest) -> Iterator[SlurmLab]:
    version: str = request.param
    missing = missing_prerequisites(version)
    if missing:
        why = (
            f"real Slurm {version} lab unavailable, missing: {', '.join(missing)} "
            "(run `make slurm-deps slurm-chroots` as root)"
        )
        if os.environ.get("DISPATCH_ALLOW_SKIP") == "1":
            pytest.skip(why)
        pytest.fail(why + "; set DISPATCH_ALLOW_SKIP=1 to skip instead")
    with SlurmLab(version, min_job_age=LAB_MIN_JOB_AGE, slurmd_timeout=10, kill_wait=2) as lab:
        yield lab


@pytest.fixture
def slurm(slurm_lab: SlurmLab) -> Iterator[SlurmLab]:
    """The session's lab, with no job left, every daemon up and the node back up after the test."""
    yield slurm_lab
    slurm_lab.ensure_daemons()
    slurm_lab.cancel_all_jobs(wait=15)
    state = slurm_lab.node_state()
    if any(word in state for word in ("down", "drain", "fail")):
        slurm_lab.set_node_state("resume")
        slurm_lab.wait_for(
            lambda: slurm_lab.node_state().rstrip("*") in ("idle", "mixed", "allocated"), 30, "node back up"
        )

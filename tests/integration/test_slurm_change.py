"""A rule's change on the real Slurms: a job killed over its memory is resubmitted with four times
the memory in another partition, and runs there to success.

The lab's Slurms enforce memory with ``JobAcctGatherParams=OverMemoryKill`` and no cgroups, so
Slurm reports the kill as a death by SIGKILL, which dispatch cannot tell from any other (cause
``unknown``: docs/slurm.md); the rule is therefore on ``unknown``. That the kill was the memory's
is what submission 2 proves: the same program, given more memory, succeeds.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from dispatch import (
    Change,
    JobSpec,
    MemoryChange,
    Phase,
    RecoveryPolicy,
    Rule,
    SlurmChange,
    SlurmOptions,
    State,
)
from dispatch._backends.slurm._adapter import open_adapter
from dispatch._cluster import compose
from dispatch._model import CauseKind
from tests.support.builders import ALICE
from tests.support.slurmlab import SlurmLab

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

HOG = 'my $x = "a" x $ARGV[0]; sleep 6;'
"""Holds a string of the given size for six seconds (Slurm samples memory every two)."""
SIZE = 150 << 20
"""More than submission 1's 100 MiB, less than submission 2's 400 MiB."""


async def test_a_memory_kill_is_recovered_with_more_memory_in_another_partition(slurm: SlurmLab) -> None:
    backend = open_adapter(slurm.backend_config(poll_interval=0.5))
    cluster = compose(backend)
    change = Change(memory=MemoryChange(factor=4, max="512Mi"), slurm=SlurmChange(partition="lowcxl"))
    spec = JobSpec(
        name="grows",
        command=("perl", "-e", HOG, str(SIZE)),
        recovery=RecoveryPolicy(rules=(Rule(on=(CauseKind.UNKNOWN,), budget=1, change=change),)),
        slurm=SlurmOptions(partition="low", memory_per_node_mb=100),
    )
    try:
        await cluster.operator.submit(spec, ALICE, supervised=True)
        run = asyncio.create_task(cluster.supervisor().run("grows"))
        deadline = time.monotonic() + 90
        while not any(v.submission == 2 and v.phase is Phase.RUNNING for v in await backend.list("grows")):
            assert time.monotonic() < deadline, "submission 2 never ran"
            assert not run.done(), run
            await asyncio.sleep(0.2)
        (second,) = [v for v in await backend.list("grows") if v.submission == 2]
        shown = slurm.job_state(second.id)
        record = await asyncio.wait_for(run, 90)
    finally:
        await cluster.aclose()
    assert shown.get("Partition") == "lowcxl", shown
    assert shown.get("MinMemoryNode") == "400M", shown
    assert [(t.from_, t.to, t.submission, t.cause.kind) for t in record.history] == [
        (State.PENDING, State.RECOVERING, 2, CauseKind.UNKNOWN),
        (State.RECOVERING, State.SUCCEEDED, 2, CauseKind.NONE),
    ]
    first_cause = record.submissions[0].cause
    assert first_cause is not None
    assert "SIGKILL" in first_cause.detail
    assert [str(c) for c in record.submissions[1].changes] == [
        "spec.slurm.memoryPerNodeMb 100 -> 400",
        "spec.slurm.partition low -> lowcxl",
    ]

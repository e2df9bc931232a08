"""Core benchmark: many jobs supervised concurrently in one process on the memory backend.

Every job is submitted (supervised), launched, preempted once while running, recovered by its rule as
submission 2, completed, and settled. One event loop, one thread: the figures are for one core.

    python bench/core_bench.py                # 10,000 jobs, 5 timing runs and 1 memory run
    python bench/core_bench.py --jobs 1000 --repeats 3
    python bench/core_bench.py --profile      # cProfile one timing run and print where time goes

Reported:

- lifecycles/s: full lifecycles (submit .. settled, with one recovery) divided by the time of the whole
  run, submission included: by the process's CPU time (one thread, so what one dedicated core does,
  whatever else the machine runs) and by wall time;
- decisions/s: calls of ``Supervisor.prepare`` (read record, list objects, decide) per second of the
  same CPU and wall time;
- memory per job: the tracemalloc peak of a separate run (tracemalloc slows everything down, so it is
  never on during timing) minus what was traced before the first submission, divided by the jobs.
  It is Python heap allocated by dispatch, the memory backend, the store and the asyncio tasks; it
  includes the records and scheduler objects the run keeps until the end.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import io
import platform
import pstats
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass

from dispatch import (
    Action,
    Actor,
    ActorKind,
    CauseKind,
    JobSpec,
    MemoryBackend,
    MemoryStore,
    Phase,
    RecoveryPolicy,
    Rule,
    Shape,
    State,
    Supervisor,
    compose,
)
from dispatch._supervisor import Intent

LIFECYCLES_TARGET = 1_000.0
BYTES_PER_JOB_TARGET = 10 * 1024
ADA = Actor(kind=ActorKind.HUMAN, id="ada")


class CountingSupervisor(Supervisor):
    """A supervisor that counts its decisions (each ``prepare`` reads, lists and decides once)."""

    decisions = 0

    async def prepare(self, job: str) -> Intent:
        self.decisions += 1
        return await super().prepare(job)


@dataclass(frozen=True)
class Result:
    jobs: int
    seconds: float
    cpu_seconds: float
    decisions: int
    conflicts: int
    writes: int
    stall: float = 0.0
    """The longest the event loop went without running a ready callback while run_all worked."""
    stall_p99: float = 0.0
    """The 99th percentile of the same (machine load preempting the process shows in the longest)."""

    @property
    def lifecycles_per_second(self) -> float:
        return self.jobs / self.seconds

    @property
    def lifecycles_per_cpu_second(self) -> float:
        return self.jobs / self.cpu_seconds

    @property
    def decisions_per_second(self) -> float:
        return self.decisions / self.seconds


def spec(i: int) -> JobSpec:
    rule = Rule(on=(CauseKind.PREEMPTED,), action=Action.RESUBMIT, budget=1)
    return JobSpec(
        name=f"job-{i}", command=("torchrun", "train.py"), nodes=2, recovery=RecoveryPolicy(rules=(rule,))
    )


class Scheduler:
    """Plays the scheduler: preempts each job's first execution once it runs, completes the second.

    It subscribes to every job, as a supervisor does, and handles only the jobs that changed.
    """

    def __init__(self, backend: MemoryBackend) -> None:
        self.backend = backend
        self.changed: set[str] = set()
        self.wake = asyncio.Event()
        self.unsubscribe: list[Callable[[], None]] = []

    def watch(self, job: str) -> None:
        def changed() -> None:
            self.changed.add(job)
            self.wake.set()

        self.unsubscribe.append(self.backend.subscribe(job, changed))

    async def run(self) -> None:
        env = self.backend.env
        while True:
            await self.wake.wait()
            self.wake.clear()
            jobs, self.changed = self.changed, set()
            for i, job in enumerate(jobs):
                if i % 32 == 31:
                    await asyncio.sleep(0)  # a fair scheduler too, so the stall measured is run_all's
                for o in await self.backend.list(job):
                    if o.phase is Phase.RUNNING:
                        if o.submission == 1:
                            env.preempt(o.id)
                        else:
                            env.complete(o.id)

    def close(self) -> None:
        for unsubscribe in self.unsubscribe:
            unsubscribe()


async def lifecycle_run(jobs: int, *, on_start: Callable[[], None] | None = None) -> Result:
    backend = MemoryBackend(Shape.SLURM, auto_run=True)
    store = MemoryStore()
    cluster = compose(backend, store=store)
    supervisor = CountingSupervisor(backend, store)
    scheduler = Scheduler(backend)
    specs = [spec(i) for i in range(jobs)]
    if on_start is not None:
        on_start()
    start = time.perf_counter()
    cpu_start = time.process_time()
    names = []
    for s in specs:
        plan = await cluster.operator.submit(s, ADA, supervised=True)
        scheduler.watch(plan.job)
        names.append(plan.job)
    driver = asyncio.create_task(scheduler.run())
    probe = StallProbe()
    ticker = asyncio.create_task(probe.run())
    settled = await supervisor.run_all(names)
    seconds = time.perf_counter() - start
    cpu_seconds = time.process_time() - cpu_start
    ticker.cancel()
    driver.cancel()
    scheduler.close()
    for record in settled.values():
        if record.state is not State.SUCCEEDED or len(record.submissions) != 2 or not record.settled:
            raise AssertionError(f"job {record.job} did not recover once and succeed: {record.state}")
    return Result(
        jobs,
        seconds,
        cpu_seconds,
        supervisor.decisions,
        store.conflicts,
        store.writes,
        probe.longest,
        probe.p99,
    )


class StallProbe:
    """Fairness of run_all: a task that asks to run every millisecond and notes
    how much CPU time the loop spent on other work before it ran. A backend whose calls never
    suspend (this one) would otherwise hold the loop
    until every job waits: one stall as long as the whole run."""

    PERIOD = 0.001

    def __init__(self) -> None:
        self.lateness: list[float] = []

    @property
    def longest(self) -> float:
        return max(self.lateness, default=0.0)

    @property
    def p99(self) -> float:
        ordered = sorted(self.lateness)
        return ordered[int(len(ordered) * 0.99)] if ordered else 0.0

    async def run(self) -> None:
        # Measured in this process's CPU time: the work the loop did before it let the probe run,
        # which the machine's load (other processes taking the core) does not inflate.
        while True:
            asked = time.process_time()
            await asyncio.sleep(self.PERIOD)
            self.lateness.append(time.process_time() - asked)


def timed(jobs: int) -> Result:
    gc.collect()
    return asyncio.run(lifecycle_run(jobs))


def memory(jobs: int) -> tuple[int, Result]:
    """Peak traced bytes of a whole run above what was traced before its first submission."""
    gc.collect()
    tracemalloc.start()
    baseline = 0

    def started() -> None:
        nonlocal baseline
        gc.collect()
        tracemalloc.reset_peak()
        baseline = tracemalloc.get_traced_memory()[0]

    try:
        result = asyncio.run(lifecycle_run(jobs, on_start=started))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return peak - baseline, result


def profile(jobs: int, top: int = 25) -> str:
    profiler = cProfile.Profile()
    profiler.enable()
    timed(jobs)
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def table(runs: list[Result], per_job: int, memory_jobs: int) -> str:
    def verdict(met: bool) -> str:
        return "yes" if met else "**no**"

    def row(name: str, values: list[float], fmt: str, target: str = "", met: str = "") -> str:
        median = statistics.median(values)
        return f"| {name} | {median:{fmt}} | {min(values):{fmt}} | {max(values):{fmt}} | {target} | {met} |"

    lifecycles = [r.lifecycles_per_second for r in runs]
    kib = per_job / 1024
    return "\n".join(
        [
            f"{runs[0].jobs:,} jobs, slurm shape with auto_run, each preempted once and recovered; "
            f"{len(runs)} timing runs (median, min, max); memory from a separate tracemalloc run "
            f"of {memory_jobs:,} jobs. Python {platform.python_version()} on {platform.machine()}, "
            "one event loop.",
            "",
            "| measure | median | min | max | target | met |",
            "|---|---:|---:|---:|---:|:---:|",
            row(
                "recovered jobs (full lifecycles) per CPU second (one core)",
                [r.lifecycles_per_cpu_second for r in runs],
                ",.0f",
                ">= 1,000",
                verdict(statistics.median([r.lifecycles_per_cpu_second for r in runs]) >= LIFECYCLES_TARGET),
            ),
            row(
                "recovered jobs (full lifecycles) per wall second",
                lifecycles,
                ",.0f",
                ">= 1,000",
                verdict(statistics.median(lifecycles) >= LIFECYCLES_TARGET),
            ),
            row(
                "decisions (Supervisor.prepare) per CPU second",
                [r.decisions / r.cpu_seconds for r in runs],
                ",.0f",
            ),
            row(
                "decisions (Supervisor.prepare) per wall second",
                [r.decisions_per_second for r in runs],
                ",.0f",
            ),
            row("CPU time of a run (s)", [r.cpu_seconds for r in runs], ".2f"),
            row("wall time of a run (s)", [r.seconds for r in runs], ".2f"),
            row("decisions per lifecycle", [r.decisions / r.jobs for r in runs], ".1f"),
            row(
                "longest event-loop stall while run_all supervises (ms of CPU)",
                [r.stall * 1000 for r in runs],
                ".2f",
            ),
            row(
                "99th percentile of the stalls (ms of CPU, probed every 1 ms)",
                [r.stall_p99 * 1000 for r in runs],
                ".2f",
            ),
            f"| peak traced memory per supervised job (KiB, tracemalloc) | {kib:.2f} | | | < 10 | "
            f"{verdict(per_job < BYTES_PER_JOB_TARGET)} |",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=10_000, help="jobs per run (default 10,000)")
    parser.add_argument(
        "--repeats", type=int, default=5, help="timing runs; the median is reported (default 5)"
    )
    parser.add_argument("--profile", action="store_true", help="also cProfile one timing run")
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.repeats < 1:
        parser.error("--jobs and --repeats must be positive")

    timed(min(args.jobs, 500))  # warm up imports and caches
    runs = []
    for i in range(args.repeats):
        result = timed(args.jobs)
        runs.append(result)
        print(
            f"run {i + 1}: {result.seconds:.2f}s wall, {result.cpu_seconds:.2f}s CPU, "
            f"{result.lifecycles_per_second:,.0f} lifecycles/s, "
            f"{result.decisions_per_second:,.0f} decisions/s, {result.conflicts} conflicts, "
            f"loop stall longest {result.stall * 1000:.2f} ms, p99 {result.stall_p99 * 1000:.2f} ms",
            file=sys.stderr,
        )
    peak, _ = memory(args.jobs)
    per_job = peak // args.jobs
    print(f"memory run: peak {peak / 2**20:.1f} MiB traced, {per_job:,} bytes per job", file=sys.stderr)
    print(table(runs, per_job, args.jobs))
    if args.profile:
        print("\n```\n" + profile(args.jobs) + "```")
    return 0


if __name__ == "__main__":
    sys.exit(main())

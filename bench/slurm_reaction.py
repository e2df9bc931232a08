"""Reaction time of the Slurm bridge: from a preemption in Slurm to the next submission authorized.

    .venv/bin/python bench/slurm_reaction.py                  # 15 samples at 2 s and at 0.5 s
    .venv/bin/python bench/slurm_reaction.py --samples 7 --intervals 2,0.5,1

Against each real Slurm lab (22.05, 24.11, 26.05; root, make slurm-deps slurm-chroots; ``--slurm``
picks), the seed scenario once per sample: a job in the CANCEL-mode partition ``lowcxl`` with the
rule ``resubmit on [preempted]``, supervised by
``dispatch.Supervisor(open_adapter(lab.backend_config(poll_interval=P)), dispatch.MemoryStore())``,
is preempted by a whole-node job submitted in ``high``.

- t0: the moment Slurm shows the job PREEMPTED. A side thread runs ``scontrol -o show job <id>``
  back to back (a new call every 20 ms, or as soon as the previous one returns); t0 is the return of
  the first call that printed ``JobState=PREEMPTED`` (the job goes RUNNING -> COMPLETING ->
  PREEMPTED; dispatch only sees an end once COMPLETING has cleared, so t0 is that last step).
- t1: the moment the record store holds the record that authorizes submission 2 (a store
  subscription stamps the time of every write; the write whose record has a second submission).

Phases are randomised. slurmctld 22.05 acts on a preemption only at a tick of its scheduler, about
once a second and, within one lab, at nearly the same fraction of the wall-clock second (sbatch of
the blocker -> PREEMPTED took 0.07..0.69 s; the report prints where t0 fell), so submitting the
blocker at a random moment does not place the preemption at a random phase of the poll cycle.
Instead the poll loop is kicked (a kick restarts its cycle) a random time in [0, 1) s after
submission 1 is seen running, and the blocker follows a random time in [0, interval) later; both
are stratified into N strata and paired at random (a Latin hypercube), so that few samples cover
the cycle evenly. The preemption then falls uniformly within the poll cycle, as it does in a
long-running process whose 2.0x s cycle drifts against Slurm's 1 s tick. Intervals are
interleaved sample by sample.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "operator")]

import dispatch  # noqa: E402
from dispatch._backends.slurm._adapter import SlurmBackend, open_adapter  # noqa: E402
from dispatch._backends.slurm._poller import Listing  # noqa: E402
from tests.support.slurmlab import SlurmLab  # noqa: E402

ALICE = dispatch.Actor(kind=dispatch.ActorKind.HUMAN, id="bench")
WATCH_PERIOD = 0.02


@dataclass
class Fetch:
    start: float
    end: float
    preempted: bool  # this GET /jobs showed the watched job PREEMPTED (COMPLETING cleared)


@dataclass
class Sample:
    interval: float
    index: int
    kick: float = 0.0  # running seen -> poll loop kicked
    delay: float = 0.0  # kick -> blocker submitted
    blocker_at: float | None = None  # sbatch of the blocker returned
    t0: float | None = None
    t0_gap: float | None = None  # time between the last non-PREEMPTED observation and t0
    t0_wall: float = 0.0
    t1: float | None = None
    exact: bool = True  # the write stamped as t1 was the one whose record was read
    fetches: list[Fetch] = field(default_factory=list)
    error: str | None = None

    @property
    def reaction(self) -> float | None:
        return None if self.t0 is None or self.t1 is None else self.t1 - self.t0

    def seen_by(self) -> Fetch | None:
        return next((f for f in self.fetches if f.preempted), None)


class Watcher(threading.Thread):
    """Side loop: scontrol on one job every ~20 ms, off the event loop, until it shows PREEMPTED."""

    def __init__(self, lab: SlurmLab, job_id: str, sample: Sample) -> None:
        super().__init__(daemon=True)
        self.lab, self.job_id, self.sample = lab, job_id, sample
        self.stop = threading.Event()

    def run(self) -> None:
        last: float | None = None
        while not self.stop.is_set():
            began = time.monotonic()
            state = self.lab.job_state(self.job_id).get("JobState", "")
            now = time.monotonic()
            if state == "PREEMPTED":
                self.sample.t0 = now
                self.sample.t0_wall = time.time()
                self.sample.t0_gap = None if last is None else now - last
                return
            last = now
            self.stop.wait(max(0.0, WATCH_PERIOD - (now - began)))


def timed_fetch(backend: SlurmBackend, sample: Sample, job_id: list[str]) -> None:
    """Record the start and end of every GET /jobs, and whether it showed the job PREEMPTED."""
    inner: Callable[[int | None], Awaitable[Listing]] = backend.poller._fetch

    async def fetch(update_time: int | None) -> Listing:
        start = time.monotonic()
        listing = await inner(update_time)
        end = time.monotonic()
        seen = bool(job_id) and any(
            str(j.job_id) == job_id[0] and j.state == "PREEMPTED" and not j.flags for j in listing.jobs or ()
        )
        sample.fetches.append(Fetch(start, end, seen))
        return listing

    backend.poller._fetch = fetch


async def wait_until(pred: Callable[[], bool], within: float, what: str, step: float = 0.005) -> None:
    deadline = time.monotonic() + within
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {within} s waiting for {what}")
        await asyncio.sleep(step)


async def one_sample(lab: SlurmLab, sample: Sample) -> None:
    name = f"react-{str(sample.interval).replace('.', 'p')}-{sample.index}"
    backend = open_adapter(lab.backend_config(poll_interval=sample.interval))
    store = dispatch.MemoryStore()
    job_id: list[str] = []
    timed_fetch(backend, sample, job_id)
    checks: set[asyncio.Task[None]] = set()

    async def check(stamp: float, write: int) -> None:
        record, version = await store.get(name)
        if sample.t1 is None and len(record.submissions) >= 2:
            sample.t1 = stamp
            sample.exact = int(version) == write

    def on_write() -> None:  # called by the store inside the write, before it returns
        task = asyncio.get_running_loop().create_task(check(time.monotonic(), store.writes))
        checks.add(task)
        task.add_done_callback(checks.discard)

    unsubscribe = store.subscribe(name, on_write)
    spec = dispatch.JobSpec(
        name=name,
        command=("sleep", "600"),
        recovery=dispatch.RecoveryPolicy(
            rules=(
                dispatch.Rule(on=(dispatch.CauseKind.PREEMPTED,), action=dispatch.Action.RESUBMIT, budget=1),
            )
        ),
        slurm=dispatch.SlurmOptions(partition="lowcxl", cpus_per_task=2),
    )
    watcher: Watcher | None = None
    run: asyncio.Task[dispatch.Record] | None = None
    try:
        await dispatch.compose(backend, store=store).operator.submit(spec, ALICE, supervised=True)
        run = asyncio.create_task(dispatch.Supervisor(backend, store).run(name))

        deadline = time.monotonic() + 60
        while not job_id:  # submission 1 running, as dispatch sees it
            if run.done():
                raise RuntimeError(f"supervisor ended early: {run.result()}")
            if time.monotonic() > deadline:
                raise TimeoutError("submission 1 never ran")
            current = (await store.get(name)).record.current
            if current is not None and current.canonical is not None:
                view = backend.poller.view(int(current.canonical))
                if view is not None and view.phase is dispatch.Phase.RUNNING:
                    job_id.append(current.canonical)
            await asyncio.sleep(0.05)
        # Slurm acts on the preemption only at a tick of its scheduler (about once a second, at
        # nearly the same fraction of a second), so a random blocker time alone does not randomise the
        # phase: put the poll loop itself at a random phase of that tick (a kick restarts its
        # cycle), then submit the blocker a random part of the interval later.
        await asyncio.sleep(sample.kick)
        backend.poller.mark_dirty(int(job_id[0]))
        await asyncio.sleep(sample.delay)
        watcher = Watcher(lab, job_id[0], sample)
        watcher.start()
        await asyncio.to_thread(lab.submit_blocker, "high", 2, 600)
        sample.blocker_at = time.monotonic()
        await wait_until(lambda: sample.t0 is not None, 30, "Slurm to show PREEMPTED", step=0.01)
        await wait_until(lambda: sample.t1 is not None, 30, "submission 2 authorized")
    except Exception as e:  # a failed sample is reported, not fatal
        sample.error = f"{type(e).__name__}: {e}"
    finally:
        if watcher is not None:
            watcher.stop.set()
            await asyncio.to_thread(watcher.join, 5)
        unsubscribe()
        if run is not None:
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)
        await backend.aclose()
        await asyncio.to_thread(lab.cancel_all_jobs, 20)


def tick_arc(walls: list[float]) -> str:
    """The shortest arc of the wall-clock second that holds every time's fraction, as 'x.aa..x.bb s'."""
    fr = sorted(w % 1 for w in walls)
    if not fr:
        return "-"
    gaps = [(fr[(i + 1) % len(fr)] - fr[i]) % 1 for i in range(len(fr))]
    i = max(range(len(fr)), key=lambda j: gaps[j]) if len(fr) > 1 else 0
    return f"x.{round(fr[(i + 1) % len(fr)] * 100) % 100:02d}..x.{round(fr[i] * 100) % 100:02d} s"


def p90(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=10, method="inclusive")[8] if len(xs) > 1 else xs[0]


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def report(results: list[Sample], intervals: list[float], samples: int, wall: float, lab: str) -> None:
    print(f"\n### Preemption -> next submission authorized (real Slurm {lab}), {samples} samples each\n")
    print("t0 = Slurm shows the job PREEMPTED (`scontrol show job`, polled every 20 ms in a side thread);")
    print("t1 = the record authorizing submission 2 is written to the store (store subscription).\n")
    print("| poll interval | n | median | min | max | p90 | mean | expected median |")
    print("|---|---|---|---|---|---|---|---|")
    details: list[str] = []
    for interval in intervals:
        ok = [s for s in results if s.interval == interval and s.reaction is not None and s.error is None]
        failed = [s for s in results if s.interval == interval and s.error is not None]
        r = [s.reaction for s in ok if s.reaction is not None]
        seen = [
            (s, f) for s in ok if (f := s.seen_by()) is not None and s.t0 is not None and s.t1 is not None
        ]
        req = [f.end - f.start for s in ok for f in s.fetches]
        sup = [s.t1 - f.end for s, f in seen if s.t1 is not None]
        wait = [f.start - s.t0 for s, f in seen if s.t0 is not None]
        # The poll loop waits `interval` after each GET /jobs returns (period: interval + request); a
        # uniformly placed event waits U(0, period) for the next GET, then the GET, then one supervisor step.
        expected = (interval + med(req)) / 2 + med(req) + med(sup)
        if not r:
            print(f"| {interval:g} s | 0 ({len(failed)} failed) | - | - | - | - | - | {expected:.3f} s |")
            continue
        print(
            f"| {interval:g} s | {len(r)}{f' ({len(failed)} failed)' if failed else ''} | {med(r):.3f} s "
            f"| {min(r):.3f} s | {max(r):.3f} s | {p90(r):.3f} s | {statistics.fmean(r):.3f} s "
            f"| {expected:.3f} s |"
        )
        gaps = [s.t0_gap for s in ok if s.t0_gap is not None]
        pre = [s.t0 - s.blocker_at for s in ok if s.t0 is not None and s.blocker_at is not None]
        details.append(
            f"| {interval:g} s | {med(wait):.3f} s ({min(wait, default=0):.3f}..{max(wait, default=0):.3f}) "
            f"| {med(req) * 1000:.1f} ms | {med(sup) * 1000:.1f} ms | {med(gaps) * 1000:.0f} ms "
            f"| {med(pre):.2f} s | {sum(not s.exact for s in ok)} |"
        )
        for s in failed:
            print(f"<!-- sample {s.index} at {interval:g} s failed: {s.error} -->")
    print("\nWhere the time goes (medians):\n")
    print(
        "| poll interval | t0 -> start of the GET /jobs that saw it | GET /jobs | that GET's answer -> t1 "
        "| t0 resolution | blocker sbatch -> t0 | inexact t1 stamps |"
    )
    print("|---|---|---|---|---|---|---|")
    for line in details:
        print(line)
    print(
        "\nExpected median = (interval + GET)/2 + GET + supervisor step: the poll loop sleeps `interval`"
        "\nafter each GET /jobs returns, so a preemption at a uniformly random moment waits"
        "\nU(0, interval + GET) for the next GET to start, then that GET, then one supervisor step"
        "\n(read record, decide, write)."
        f"\nEvery t0 fell within {tick_arc([s.t0_wall for s in results if s.t0 is not None])} of a"
        " wall-clock second: slurmctld acts on the preemption at its scheduler's tick."
        f"\n\n{len(results)} samples in {wall:.0f} s,"
        f" load average {os.getloadavg()[0]:.2f} (2 cores, shared)."
    )
    for s in sorted(results, key=lambda s: (s.interval, s.index)):
        f = s.seen_by()
        print(
            f"<!-- {s.interval:g}s #{s.index}: kick {s.kick:.2f} delay {s.delay:.2f} reaction "
            f"{'-' if s.reaction is None else f'{s.reaction:.3f}'} "
            f"wait {'-' if f is None or s.t0 is None else f'{f.start - s.t0:.3f}'}"
            f" t0 at x{s.t0_wall % 1:.2f} s"
            f" {s.error or ''} -->"
        )


async def bench(samples: int, intervals: list[float], seed: int, version: str) -> None:
    rng = random.Random(seed)
    results: list[Sample] = []
    began = time.monotonic()
    print(f"Slurm {version}", flush=True)
    with SlurmLab(version, min_job_age=300) as lab:
        # Latin hypercube over (kick, delay): both stratified in N strata, paired at random.
        plan: list[Sample] = []
        for interval in intervals:
            strata = rng.sample(range(samples), samples)
            for k in range(samples):
                kick = (k + rng.random()) / samples
                delay = (strata[k] + rng.random()) / samples * interval
                plan.append(Sample(interval, k, kick=kick, delay=delay))
        order = rng.sample(range(samples), samples)
        for k in order:  # interleave the intervals
            for sample in (p for p in plan if p.index == k):
                await one_sample(lab, sample)
                results.append(sample)
                r = sample.reaction
                print(
                    f"  {sample.interval:g} s #{k}: {'-' if r is None else f'{r:.3f} s'}",
                    sample.error or "",
                    file=sys.stderr,
                    flush=True,
                )
        api = lab.api_version
    report(results, intervals, samples, time.monotonic() - began, f"{version} lab, {api}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", "--reaction", type=int, default=15, help="samples per poll interval (>= 2)")
    ap.add_argument(
        "--intervals", default="2,0.5", help="poll intervals, comma-separated (2 s is the default)"
    )
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--slurm", default="22.05,24.11,26.05", help="Slurm versions, comma-separated")
    args = ap.parse_args()
    intervals = [float(x) for x in args.intervals.split(",")]
    for version in args.slurm.split(","):
        asyncio.run(bench(max(args.samples, 2), intervals, args.seed, version.strip()))


if __name__ == "__main__":
    main()
